"""A client written only for OCL's in-request `$match` and `$rerank`, on the real stack (gunicorn API, a
prefork lane worker, a private Redis): it sends a browser's preflight, posts, and reads each row's `results`
from the answer. It knows nothing of handles, polling or capacity headers, and gets every row's candidates,
in off, shadow and enforce mode alike; a capacity-aware client gets a 429 in enforce when a lane is full,
and a `respond-async` client polls to the same body."""
import pytest
import requests

from tests.integration.workers.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]
ORIGIN = 'https://mapper.example.org'
MAPPER_HEADERS = {'INCLUDESEARCHLATEST': 'true', 'X-OCL-CLIENT': 'MapperUI', 'Origin': ORIGIN}
ROWS = [{'name': 'heart attack', '__index': 0}, {'name': 'high blood pressure', '__index': 1},
        {'name': 'head ache', '__index': 2}, {'name': 'sugar diabetes', '__index': 3}]


class OclOnlyClient:
    """What the OCL Mapper does: a CORS preflight, then one POST per batch, reading `results` per row."""

    def __init__(self, url, token):
        self.url, self.token = url, token

    def post(self, path, body, query, extra=None):
        preflight = requests.options(f'{self.url}{path}', headers={
            'Origin': ORIGIN, 'Access-Control-Request-Method': 'POST',
            'Access-Control-Request-Headers': 'authorization,content-type,includesearchlatest,x-ocl-client'},
            timeout=10)
        assert preflight.status_code == 200, preflight.text
        allowed = {h.strip().lower() for h in preflight.headers['Access-Control-Allow-Headers'].split(',')}
        assert {'authorization', 'content-type', 'includesearchlatest', 'x-ocl-client'} <= allowed
        headers = {'Authorization': f'Token {self.token}', **MAPPER_HEADERS, **(extra or {})}
        return requests.post(f'{self.url}{path}', params=query, json=body, headers=headers, timeout=120)

    def match(self, source, **query):
        response = self.post('/concepts/$match/', {'rows': ROWS, 'target_repo_url': source, 'map_config': [],
                                                   'filter': {}}, query)
        assert response.status_code == 200, response.text
        assert response.headers['Access-Control-Allow-Origin'] in (ORIGIN, '*')
        answer = response.json()
        return answer, response


def candidates(answer):
    return [[concept['id'] for concept in entry['results']] for entry in answer]


@pytest.fixture
def stack(fault_stack, configure):
    wide = {'staff': 40, 'core': 40, 'early_access': 40, 'preview': 40}
    configure(per_user=wide, tiers=wide, cache={'ttl_seconds': 0})  # every call runs: nothing is shared
    return fault_stack


@pytest.mark.parametrize('mode', ['off', 'shadow', 'enforce'])
def test_an_ocl_only_client_reads_every_rows_candidates_in_every_mode(stack, configure, tiny_source, make_user,
                                                                      mode):
    configure(mode=mode, enforce_for='all')
    url = stack.api('api-a', threads=8)
    stack.worker(name='lanes', queues=('interactive', 'es2_knn', 'api_heavy'))
    client = OclOnlyClient(url, make_user().auth_token.key)
    answers = {}
    for name, query in {'lexical': {}, 'semantic': {'semantic': 'true'},
                        'reranked': {'semantic': 'true', 'reranker': 'true'}}.items():
        answer, response = client.match(tiny_source, limit='15', **query)
        assert [entry['row'] for entry in answer] == ROWS  # every row, in order, as sent
        assert int(response.headers['num_returned']) == sum(len(entry['results']) for entry in answer)
        if name != 'lexical':
            assert all(len(entry['results']) == 15 for entry in answer)  # limit=15 in the query
            assert response.headers['Content-Location'].startswith('/tasks/')
            decision = response.headers.get('X-OCL-Capacity-Decision')
            assert decision == (None if mode == 'off' else 'admitted')
        assert all(entry['results'][0]['search_meta']['match_type'] for entry in answer if entry['results'])
        answers[name] = candidates(answer)
    assert answers['semantic'][0][0] == 'TC005' and answers['reranked'][2][0] == 'TC011'
    rows = [{'display_name': name, 'id': i} for i, name in enumerate(['Fever', 'Headache', 'Migraine'])]
    reranked = client.post('/concepts/$rerank/', {'q': 'headache', 'rows': rows}, {})
    assert reranked.status_code == 200, reranked.text
    assert [row['id'] for row in reranked.json()][0] == 1
    assert all('search_rerank_score' in row for row in reranked.json())
    assert stack.leases() == 0


def test_off_shadow_and_enforce_answer_the_same_bodies(stack, configure, tiny_source, make_user):
    url = stack.api('api-a', threads=8)
    stack.worker(name='lanes', queues=('interactive', 'es2_knn', 'api_heavy'))
    client = OclOnlyClient(url, make_user().auth_token.key)
    bodies = {}
    for mode in ('off', 'shadow', 'enforce'):
        configure(mode=mode, enforce_for='all')
        bodies[mode] = client.match(tiny_source, semantic='true', reranker='true', limit='5')[1].content
    assert bodies['off'] == bodies['shadow'] == bodies['enforce']


def test_an_aware_client_gets_a_429_when_full_and_a_polling_client_polls_to_the_same_body(
        stack, configure, tiny_source, make_user):
    url = stack.api('api-a', threads=8)
    token = make_user().auth_token.key
    aware = {'X-OCL-Event-Metadata': '{"capacity_aware": "true"}'}
    client = OclOnlyClient(url, token)
    # No worker yet, and room for one call in this user's lane: the first is queued and holds it.
    configure(mode='enforce', enforce_for='aware', per_user={'staff': 1, 'core': 1, 'early_access': 1, 'preview': 1})
    body = {'rows': ROWS, 'target_repo_url': tiny_source}
    first = client.post('/concepts/$match/', body, {'semantic': 'true', 'limit': '3'},
                        {**aware, 'Prefer': 'respond-async'})
    assert first.status_code == 202 and first.headers['Preference-Applied'] == 'respond-async'
    refused = client.post('/concepts/$match/', {**body, 'rows': ROWS[:2]}, {'semantic': 'true'}, aware)
    assert refused.status_code == 429 and int(refused.headers['Retry-After']) >= 1
    assert refused.json()['error_code'] == 'capacity_exceeded'
    stack.worker(name='lanes', queues=('interactive', 'es2_knn', 'api_heavy'))
    task = wait_until(lambda: (lambda t: t if t['state'] == 'succeeded' else None)(requests.get(
        f"{url}/tasks/{first.json()['id']}/?wait=5", headers={'Authorization': f'Token {token}'},
        timeout=30).json()), timeout=60, interval=0.1, message='the queued call to succeed')
    waited, _ = client.match(tiny_source, semantic='true', limit='3')  # not aware: waits, the lane is free
    assert task['result'] == waited
    assert stack.leases() == 0


def test_the_python_client_gets_a_quick_calls_answer_in_its_submission_and_a_handle_when_the_wait_runs_out(
        stack, configure, tiny_source, make_user):
    from heavy_lanes_client.client import Client
    from heavy_lanes_client.models import State

    url = stack.api('api-a', threads=8)
    client = Client(url, make_user().auth_token.key)
    # No worker: the wait runs out and the submission answers the handle.
    handle = client.submit_match(['heart attack'], tiny_source, wait=1)
    assert handle.immediate is None and handle.id
    stack.worker(name='lanes', queues=('interactive', 'es2_knn', 'api_heavy'))
    assert client.wait(handle).state == State.SUCCEEDED
    quick = client.submit_match(['head ache', 'sugar diabetes'], tiny_source, wait=30)
    assert quick.immediate is not None and quick.immediate.state == State.SUCCEEDED
    assert [entry['row']['name'] for entry in quick.immediate.result] == ['head ache', 'sugar diabetes']
    assert quick.id and client.get_task(quick.id).state == State.SUCCEEDED
    assert stack.leases() == 0
