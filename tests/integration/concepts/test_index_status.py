"""What status pages say of a source's indexes while they are built: step, texts embedded of total, elapsed,
and ready, failed or missing (concepts.matching.store.part_status, concepts.services.index_status)."""
import fcntl

import pytest
from rest_framework.test import APIClient

from concepts.matching import adapter, store
from concepts.matching.embedders import make_embedder


def semantic_directory(source, embedder):
    return store.semantic_directory(store.source_key(source), make_embedder(embedder))


@pytest.mark.django_db
def test_a_semantic_build_shows_its_step_and_the_texts_embedded_of_all_while_it_runs(tiny_source):
    directory = semantic_directory(tiny_source, 'minilm')
    assert store.part_status(directory) == {'state': 'missing'}
    seen = []  # what a status page read each time the build reported a line

    def report(line):
        seen.append((line, store.part_status(directory)))

    assert store.build_missing(tiny_source, 'minilm', lexical=False, report=report) == ['semantic']

    texts, _ = adapter.concept_texts(store.semantic_index(tiny_source, 'minilm').table)
    building = [status for _, status in seen if status['state'] == 'building']
    assert [status['step'] for status in building] == ['reading the source', 'embedding', 'fitting the adapter',
                                                      'saving']
    embedding = building[1]
    assert (embedding['done'], embedding['total']) == (0, len(texts))
    assert all(status['elapsed_seconds'] >= 0 for status in building)
    assert 'embedding 0 of' in seen[1][0]
    ready = store.part_status(directory)
    assert ready['state'] == 'ready' and ready['elapsed_seconds'] >= 0


@pytest.mark.django_db
def test_a_part_is_building_while_a_process_holds_its_lock_and_failed_after_its_build_raised(tiny_source):
    directory = semantic_directory(tiny_source, 'tfidf-svd')
    directory.parent.mkdir(parents=True)
    with open(store.lock_path(directory), 'a+b') as held:  # another builder, still waiting or working
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert store.part_status(directory) == {'state': 'building', 'step': 'waiting to start', 'done': None,
                                                'total': None, 'elapsed_seconds': None}
    assert store.part_status(directory) == {'state': 'missing'}

    def build(progress):
        progress('embedding', 3, 10)
        raise MemoryError('the machine ran out')

    with pytest.raises(MemoryError):
        store._load_or_build(directory, 'semantic-tfidf-svd', build, load=None)
    failed = store.part_status(directory)
    assert failed['state'] == 'failed' and failed['error'] == 'MemoryError: the machine ran out'
    assert not directory.exists()


@pytest.mark.django_db
def test_the_staff_status_shows_each_sources_indexes(lanes, make_user, tiny_source, settings):
    settings.CONCEPTS_EMBEDDER = 'tfidf-svd'
    store.build_missing(tiny_source, 'tfidf-svd', semantic=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f'Token {make_user(username="ada", is_staff=True).auth_token.key}')

    indexes = client.get('/capacity/status/').json()['indexes']

    assert indexes[tiny_source.url]['lexical']['state'] == 'ready'
    assert indexes[tiny_source.url]['semantic'] == {'state': 'missing', 'embedder': 'tfidf-svd'}
