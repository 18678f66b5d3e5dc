"""An API process whose database refuses every write (a read-only disk or server), on the real stack
(gunicorn, the test's own redis-server): a submission is answered 503 `database_unavailable`, saying the
database failed (not the queue), and nothing is half-submitted: no row, no message on the broker, no lease,
no claim of its work or of its Idempotency-Key left in Redis. A config change through it says the same.
The same calls through an API that can write go through."""
import pytest
import requests

from tests.integration.workers.test_queue import ROWS
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def submit(url, token, source, **headers):
    return requests.post(f'{url}/concepts/$match/?semantic=true',
                         json={'rows': ROWS, 'target_repo_url': source},
                         headers={'Authorization': f'Token {token}', **headers}, timeout=30)


def claims(stack):
    client = stack.lanes()
    try:
        return sorted(key.decode() for key in client.scan_iter(match=f'{stack.key_prefix}:claim:*'))
    finally:
        client.close()


def refused_by_the_database(response):
    body = response.json()
    return (response.status_code == 503 and body['error_code'] == 'database_unavailable'
            and 'database' in body['detail'] and response.headers.get('Retry-After') == '5')


@pytest.mark.parametrize('database', [
    pytest.param('sqlite'), pytest.param('postgres', marks=pytest.mark.postgres)])
def test_an_api_whose_database_refuses_writes_says_so_and_submits_nothing(
        fault_stack, configure, tiny_source, make_user, database, settings):
    if (settings.DATABASES['default']['ENGINE'] == 'django.db.backends.sqlite3') != (database == 'sqlite'):
        pytest.skip(f'runs in the {database} pass')
    configure(cache={'ttl_seconds': 0})
    read_only = fault_stack.api('api-ro', HEAVY_LANES_TEST_READ_ONLY_DB=1)
    token = make_user().auth_token.key
    staff = make_user(is_staff=True).auth_token.key

    answers = [submit(read_only, token, tiny_source, Prefer='respond-async'),  # a handle
               submit(read_only, token, tiny_source),  # waits in the request, as OCL's clients do
               submit(read_only, token, tiny_source, Prefer='respond-async', **{'Idempotency-Key': 'k-1'})]
    assert all(refused_by_the_database(a) for a in answers), [(a.status_code, a.text) for a in answers]
    assert Work.objects.count() == 0
    assert fault_stack.messages() == set()  # no message without a row
    assert fault_stack.leases() == 0 and fault_stack.lease_members() == ({}, 0)
    assert claims(fault_stack) == []
    change = requests.patch(f'{read_only}/capacity/config/', json={'es2_knn': 5},
                            headers={'Authorization': f'Token {staff}'}, timeout=30)
    assert refused_by_the_database(change), (change.status_code, change.text)

    # The database, not the stack, refused: an API that can write takes the same calls.
    writable = fault_stack.api('api-rw')
    accepted = submit(writable, token, tiny_source, Prefer='respond-async', **{'Idempotency-Key': 'k-1'})
    assert accepted.status_code == 202, accepted.text
    assert list(Work.objects.values_list('pk', flat=True)) == [accepted.json()['id']]
    assert fault_stack.messages() == {accepted.json()['id']}
