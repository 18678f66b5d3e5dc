"""A semantic `$match` of 100 rows over the whole HPO, through the API and Celery's in-process worker."""
import pytest

from concepts.matching import store
from concepts.terminology import read_hpo
from tests.integration.concepts.test_hpo_match import bag, known_synonyms, use_shared_hpo_indexes
from tests.integration.workers.conftest import wait_until

# The HPO indexes are built once per machine (see use_shared_hpo_indexes); the first build takes minutes.
pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(1500)]


@pytest.fixture
def hpo_indexes(db, settings):
    use_shared_hpo_indexes(settings)
    yield
    store.clear_cache()


def test_a_hundred_known_synonyms_come_back_with_their_concepts_first(hpo_indexes, in_process_worker, make_user,
                                                                     api_as):
    pairs = known_synonyms(read_hpo(), 100, seed=11)
    client = api_as(make_user('core_user'))
    response = client.post('/concepts/$match/?semantic=true&limit=5&verbose=true', HTTP_PREFER='respond-async',
                           data={'rows': [{'name': synonym, 'id': i} for i, (synonym, _) in enumerate(pairs)],
                                 'target_repo_url': '/orgs/HPO/sources/HPO/'}, format='json')
    assert response.status_code == 202 and response.json()['lane'] == 'es2_knn'
    call_id = response.json()['id']
    task = wait_until(lambda: (lambda body: body if body['state'] not in ('queued', 'running') else None)(
        client.get(f'/tasks/{call_id}/?wait=20').json()), timeout=120, interval=0.1, message='the match')
    assert task['state'] == 'succeeded', task
    answer = task['result']
    assert [(entry['row']['id'], entry['results'][0]['id'],
             bag(synonym) in [bag(name['name']) for name in entry['results'][0]['names']])
            for entry, (synonym, _) in zip(answer, pairs)] == [(i, code, True) for i, (_, code) in enumerate(pairs)]
    assert all(len(entry['results']) == 5 for entry in answer)
