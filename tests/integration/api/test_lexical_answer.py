"""A lexical `$match` runs in the request: its answer is made an entry at a time as it is sent, so an API
process never holds it whole, and the bytes are those of the whole list rendered at once (OCL's format)."""
import json
import tracemalloc

import pytest
from rest_framework.renderers import JSONRenderer

from concepts import services

pytestmark = pytest.mark.redis
SOURCE = '/orgs/HL/sources/TinyClinical/'
# The body: 1,000 rows and a 29 KB map_config (57 KB), whose answer echoes map_config in every row.
ROWS = [{'name': f'chest pain {i}'} for i in range(1000)]
MAP_CONFIG = [{'target': 'x' * 29_000}]


def sent_bytes(response):
    """Read an answer as a client does, a piece at a time when it is streamed: (its size, its largest piece)."""
    size = largest = 0
    for piece in response.streaming_content if response.streaming else [response.content]:
        size += len(piece)
        largest = max(largest, len(piece))
    return size, largest


def test_a_large_lexical_answer_is_never_held_whole_by_the_api(settings, make_user, api_as, tiny_source,
                                                                lanes_redis):
    settings.MAX_ECHO_BYTES = 64 * 1024 * 1024  # let the body through: the echo bound refuses it
    client = api_as(make_user())
    body = {'rows': ROWS, 'target_repo_url': SOURCE, 'map_config': MAP_CONFIG}
    assert len(json.dumps(body)) < 60_000
    # The first call loads the source's index and measures its candidates: not what a call holds.
    client.post('/concepts/$match/', {**body, 'rows': ROWS[:1]}, format='json')
    tracemalloc.start()
    try:
        response = client.post('/concepts/$match/', body, format='json')
        assert response.status_code == 200
        size, largest = sent_bytes(response)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert size > 29_000_000 and response['num_returned'] == '1000'
    # Made whole, the answer took twice its size at once (its text, then its bytes); streamed, a few entries.
    assert peak < 4_000_000, f'{peak} bytes allocated at the peak for an answer of {size}'
    assert largest < 200_000


@pytest.mark.parametrize('slice_characters', [0, 4 * 1024 * 1024])  # streamed, and whole
def test_a_lexical_answer_is_the_bytes_of_the_whole_list_rendered_at_once(
        slice_characters, settings, make_user, api_as, tiny_source, lanes_redis):
    settings.RESULT_SLICE_CHARACTERS = slice_characters
    body = {'rows': [{'name': 'chest pain', 'note': 'line\u2028separator ünïcode'}, {'name': 'fever', 'id': 7},
                     {'name': 'heart attack', 'extra': None}],
            'target_repo_url': SOURCE, 'map_config': [{'a': 'é\u2029', 'b': [1, 2.5, None]}],
            'filter': {'locale': 'en'}}
    query = {'limit': '3', 'verbose': 'true', 'bestMatch': 'true'}
    response = api_as(make_user()).post('/concepts/$match/?limit=3&verbose=true&bestMatch=true', body,
                                        format='json')
    assert response.status_code == 200
    sent = b''.join(response.streaming_content) if response.streaming else response.content
    assert response.streaming is (slice_characters == 0)
    assert response['Content-Type'] == 'application/json'
    whole = services.run_match(services.validate_match(body, query), semantic=False, reranker=False)
    assert sent == JSONRenderer().render(whole)
    assert response['num_returned'] == str(sum(len(entry['results']) for entry in whole))
