"""Answer bounds (concepts.bounds): a body whose answer could hold more candidates (rows x limit) or bytes
than configured is a 400 naming the bound and its value, before anything is counted; and the bytes
estimate is an upper bound of every answer it lets through."""
import json

import pytest
from hypothesis import HealthCheck, given, settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.renderers import JSONRenderer

from capacity.constants import Lane
from capacity.keys import lane_key
from concepts import bounds, services
from concepts.models import Source
from workers.models import Call

pytestmark = pytest.mark.redis
SOURCE = '/orgs/HL/sources/TinyClinical/'  # 40 concepts


def match(client, body, query):
    return client.post(f'/concepts/$match/?{query}', body, format='json', HTTP_PREFER='respond-async')


def rows(count):
    return [{'name': f'chest pain {i}'} for i in range(count)]


@pytest.mark.parametrize('query', ['semantic=true&limit=100&verbose=true', 'reranker=true&limit=100',
                                   'limit=100&verbose=true'])
def test_more_candidates_than_the_bound_is_a_400_naming_it_and_takes_nothing(
        query, settings, make_user, api_as, tiny_source, lanes_redis, broker):
    settings.MAX_MATCH_CANDIDATES = 10_000
    user = make_user()
    response = match(api_as(user), {'rows': rows(1000), 'target_repo_url': SOURCE}, query)
    assert response.status_code == 400, response.content[:300]
    message, = response.json()['detail']['rows']
    # 1000 rows x 40 candidates (the limit of 100, but the source has 40 concepts)
    assert 'MAX_MATCH_CANDIDATES is 10000' in message and '40000' in message
    assert response.json()['error_code'] == 'invalid'
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0 and not Call.objects.exists()


def test_the_candidate_bound_admits_exactly_up_to_its_value(settings, make_user, api_as, tiny_source, lanes_redis,
                                                             broker):
    settings.MAX_MATCH_CANDIDATES = 250
    client = api_as(make_user('core_user'))
    assert match(client, {'rows': rows(25), 'target_repo_url': SOURCE}, 'semantic=true&limit=10').status_code == 202
    assert match(client, {'rows': rows(26), 'target_repo_url': SOURCE}, 'semantic=true&limit=10').status_code == 400
    # offset past the source's concepts leaves fewer candidates a row
    assert match(client, {'rows': rows(50), 'target_repo_url': SOURCE},
                 'semantic=true&limit=10&offset=35').status_code == 202


def test_an_answer_that_could_pass_the_byte_bound_is_a_400_naming_it(settings, make_user, api_as, tiny_source,
                                                                     lanes_redis, broker):
    settings.MAX_ANSWER_BYTES = 200_000
    client = api_as(make_user())
    small = match(client, {'rows': rows(10), 'target_repo_url': SOURCE}, 'semantic=true&limit=5')
    assert small.status_code == 202
    # map_config and filter are echoed in every row's entry: 200 rows x 2 KB is 400 KB of echo alone
    big = match(client, {'rows': rows(200), 'target_repo_url': SOURCE, 'map_config': [{'note': 'x' * 2000}]},
                'semantic=true&limit=1')
    assert big.status_code == 400, big.content[:300]
    message, = big.json()['detail']['rows']
    assert 'MAX_ANSWER_BYTES is 200000 bytes' in message and 'map_config' in message


@pytest.mark.parametrize('query', ['', 'semantic=true'])  # in the request, and queued
def test_a_body_whose_answer_would_echo_more_than_the_bound_is_a_400_naming_it(
        query, settings, make_user, api_as, tiny_source, lanes_redis, broker):
    # The body: 57 KB whose answer echoed its 29 KB map_config on each of 1,000 rows (29.5 MB).
    body = {'rows': rows(1000), 'target_repo_url': SOURCE, 'map_config': [{'target': 'x' * 29_000}]}
    user = make_user()
    refused = match(api_as(user), body, query)
    assert refused.status_code == 400, refused.status_code
    message, = refused.json()['detail']['rows']
    assert message.startswith('1000 rows would echo map_config and filter in 29017000 bytes; the bound '
                              'MAX_ECHO_BYTES is 4194304 bytes a call'), message
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0 and not Call.objects.exists()
    # A map_config of 4 KB on as many rows is what the bound lets through.
    body['map_config'] = [{'target': 'x' * 4000}]
    assert match(api_as(user), body, query).status_code in (200, 202)


def test_a_rerank_answer_is_bounded_too(settings, make_user, api_as, lanes_redis, broker, db):
    settings.MAX_ANSWER_BYTES = 50_000
    client = api_as(make_user())
    body = {'q': 'chest pain', 'rows': [{'display_name': 'x' * 100} for _ in range(100)]}
    assert client.post('/concepts/$rerank/', body, format='json', HTTP_PREFER='respond-async').status_code == 202
    body['rows'] = [{'display_name': 'x' * 1000} for _ in range(100)]
    refused = client.post('/concepts/$rerank/', body, format='json', HTTP_PREFER='respond-async')
    assert refused.status_code == 400 and 'MAX_ANSWER_BYTES is 50000' in refused.json()['detail']['rows'][0]


def test_the_lexical_match_in_the_request_is_bounded(settings, make_user, api_as, tiny_source, lanes_redis):
    settings.MAX_MATCH_CANDIDATES = 100
    response = api_as(make_user()).post('/concepts/$match/?limit=10', {'rows': rows(11), 'target_repo_url': SOURCE},
                                        format='json')
    assert response.status_code == 400 and 'MAX_MATCH_CANDIDATES is 100' in response.json()['detail']['rows'][0]


# --- the estimate is an upper bound

TEXT = st.text(st.characters(blacklist_categories=('Cs', 'Cc')), min_size=1, max_size=40).filter(str.strip)
WORDS = st.lists(st.sampled_from(['chest', 'pain', 'blood', 'pressure', 'fever', 'heart', 'attack', 'high',
                                  'sugar', 'head', 'ache', 'asthma']), min_size=1, max_size=6).map(' '.join)
SCALAR = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
ROW = st.fixed_dictionaries({'name': WORDS | TEXT}, optional={'id': SCALAR, 'note': TEXT})


@pytest.mark.parametrize('semantic, reranker', [(True, False), (False, True), (False, False)])
def test_no_answer_is_larger_than_its_estimate(semantic, reranker, tiny_source):
    sizes = bounds.candidate_sizes(Source.objects.get())

    @hypothesis_settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(ROW, min_size=1, max_size=8), st.integers(1, 100), st.integers(0, 45), st.booleans(),
           st.booleans(), st.dictionaries(st.sampled_from(['a', 'b']), SCALAR, max_size=2))
    def check(body_rows, limit, offset, verbose, best_match, echo):
        query = {'limit': str(limit), 'offset': str(offset), 'verbose': str(verbose).lower(),
                 'bestMatch': str(best_match).lower()}
        payload = services.validate_match({'rows': body_rows, 'target_repo_url': SOURCE, 'map_config': [echo],
                                           'filter': echo}, query)
        answer = JSONRenderer().render(services.run_match(payload, semantic=semantic, reranker=reranker))
        estimate = bounds.match_answer_bytes(payload['body'], payload['params'], sizes)
        assert len(answer) <= estimate, (len(answer), estimate, json.loads(answer))
    check()
