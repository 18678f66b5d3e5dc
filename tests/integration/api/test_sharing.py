"""Identical heavy calls over HTTP: the second joins the first's work (no lease, no message, its own
handle), a succeeded call's result answers identical calls within cache.ttl_seconds without the lane store,
and a full waiting room refuses before anything is written. Most cases have sharing across users on; by
default only one user's own identical calls share."""
from unittest import mock

import pytest

from capacity.constants import HEADER_DECISION, HEADER_LIMIT, HEADER_SUGGESTED, Lane
from capacity.keys import lane_key
from capacity.operations import Operations
from concepts.models import Source
from tests.integration.api.test_submission import MANY, match, user_leases
from tests.integration.workers.conftest import wait_until
from workers import messages
from workers.models import Call

pytestmark = pytest.mark.redis
ROWS = [{'name': 'high blood pressure'}, {'name': 'heart attack'}]


@pytest.fixture(autouse=True)
def across_users(settings):
    settings.HEAVY_LANES_SHARE_ACROSS_USERS = True


def same(client, source, **headers):
    return match(client, source, rows=ROWS, same=True, **headers)


def new_version():
    """A new version of the tiny source, saved as a reload saves it (concepts.loader): announced, so no
    process keeps the old one (workers.local_cache)."""
    source = Source.objects.get(org='HL', mnemonic='TinyClinical')
    source.version = 'v-next'
    source.save()


def depth(broker):
    return messages.depth('es2_knn', broker)


def test_an_identical_call_joins_the_open_one_without_a_lease_or_a_message(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    first_user, second_user = make_user(), make_user()
    first = same(api_as(first_user), tiny_source)
    second = same(api_as(second_user), tiny_source)
    assert (first.status_code, second.status_code) == (202, 202)
    assert first[HEADER_DECISION] == 'admitted' and second[HEADER_DECISION] == 'coalesced'
    assert HEADER_LIMIT not in second  # capacity headers only on calls that were admitted
    assert first.json()['id'] != second.json()['id']
    assert depth(broker) == 1  # one message: one run
    assert user_leases(lanes_redis, first_user) == 1 and user_leases(lanes_redis, second_user) == 0
    follower = Call.objects.get(pk=second.json()['id'])
    assert (follower.served_as, follower.work_id, follower.owner_id) == ('coalesced', first.json()['id'],
                                                                        second_user.pk)
    # Each handle is its owner's alone.
    assert api_as(first_user).get(f'/tasks/{follower.pk}/').status_code == 404
    body = api_as(second_user).get(f'/tasks/{follower.pk}/').json()
    assert (body['state'], body['position']) == ('queued', 1)


def test_a_call_that_differs_in_anything_the_result_depends_on_runs_its_own_work(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(per_user=MANY, tiers=MANY, es2_knn=50, api_heavy={'cluster': 50, 'per_task': 50})
    client = api_as(make_user())
    same(client, tiny_source)
    assert match(client, tiny_source, rows=ROWS, same=True, query='semantic=true&reranker=true')[
        HEADER_DECISION] == 'admitted'
    assert match(client, tiny_source, rows=ROWS[:1], same=True)[HEADER_DECISION] == 'admitted'
    new_version()
    assert same(client, tiny_source)[HEADER_DECISION] == 'admitted'
    assert same(client, tiny_source)[HEADER_DECISION] == 'coalesced'


def test_a_follower_is_not_refused_when_the_lanes_are_full(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(mode='enforce', enforce_for='all', es2_knn=2, per_user=MANY, tiers=MANY)  # a bulk lane of 1
    assert same(api_as(make_user()), tiny_source).status_code == 202
    assert match(api_as(make_user()), tiny_source).status_code == 429  # other work: the lane is full
    joined = same(api_as(make_user()), tiny_source)
    assert joined.status_code == 202 and joined[HEADER_DECISION] == 'coalesced'


def test_a_call_served_by_shared_work_carries_the_suggested_concurrency_of_the_lanes_now(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(es2_knn=2, per_user=MANY, tiers=MANY)  # a bulk es2_knn lane of 1: the first call fills it
    first = same(api_as(make_user()), tiny_source)
    joined = same(api_as(make_user()), tiny_source)
    assert (first[HEADER_DECISION], joined[HEADER_DECISION]) == ('admitted', 'coalesced')
    # A client sizes its run by it: one call at once while es2_knn is full, not the per-user limit of 50.
    assert (first[HEADER_SUGGESTED], joined[HEADER_SUGGESTED]) == ('1', '1')
    configure(es2_knn=2, per_user=MANY, tiers=MANY, mode='off')
    assert HEADER_SUGGESTED not in same(api_as(make_user()), tiny_source)  # off: no capacity headers at all


def test_a_full_waiting_room_refuses_before_anything_is_written(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(mode='enforce', enforce_for='all', es2_knn=2, per_user=MANY, tiers=MANY,
              queue={'deadline_seconds': 600, 'max_waiting': {'interactive': 0, 'es2_knn': 1, 'api_heavy': 0}})
    client = api_as(make_user('core_user'))
    assert [match(client, tiny_source).status_code for _ in range(2)] == [202, 202]
    rows, messages_before = Call.objects.count(), depth(broker)
    keys_before = set(lanes_redis.scan_iter(match='*'))
    leases_before = lanes_redis.zcard(lane_key(Lane.ES2_KNN))
    refused = same(client, tiny_source)
    assert refused.status_code == 429 and refused.json()['error_code'] == 'capacity_exceeded'
    assert Call.objects.count() == rows and depth(broker) == messages_before  # no row, no message
    assert lanes_redis.zcard(lane_key(Lane.ES2_KNN)) == leases_before  # no lease
    new_keys = {key.decode() for key in set(lanes_redis.scan_iter(match='*')) - keys_before}
    assert not [key for key in new_keys if ':claim:' in key]  # and no claim on the work


@pytest.mark.slow
def test_a_warm_result_answers_without_the_lane_store_until_the_ttl_or_a_new_version(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis, configure):
    configure(cache={'ttl_seconds': 2})
    client = api_as(make_user())
    cold = same(client, tiny_source, HTTP_PREFER='wait=30')
    assert cold.status_code == 200 and cold[HEADER_DECISION] == 'admitted'
    other = api_as(make_user())
    with mock.patch.object(Operations, 'acquire', side_effect=AssertionError('the lane store was used')):
        warm = same(other, tiny_source, HTTP_PREFER='wait=30')
        handle = same(other, tiny_source)  # respond-async: a handle already succeeded
    assert warm.status_code == 200 and warm[HEADER_DECISION] == 'cached'
    assert int(warm[HEADER_SUGGESTED]) >= 1 and int(handle[HEADER_SUGGESTED]) >= 1  # nothing else in flight
    assert warm.content == cold.content  # byte for byte
    assert handle.status_code == 202 and handle.json()['state'] == 'succeeded'
    call = Call.objects.get(pk=handle.json()['id'])
    assert call.served_as == 'cached' and call.work_id == cold['Content-Location'].split('/')[2]
    assert other.get(f'/tasks/{call.pk}/').json()['result'] == cold.json()
    # After the TTL it runs again, and so it does for a new version of the source.
    wait_until(lambda: same(other, tiny_source)[HEADER_DECISION] != 'cached', timeout=10, interval=0.5,
               message='the warm result to go stale')
    new_version()
    assert same(client, tiny_source)[HEADER_DECISION] == 'admitted'


@pytest.mark.slow
def test_the_in_request_answer_of_a_waiting_follower_is_its_leaders(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis):
    import threading
    answers = {}

    def post(name):
        answers[name] = same(api_as(make_user()), tiny_source, HTTP_PREFER='wait=30')
    threads = [threading.Thread(target=post, args=(name,)) for name in 'abc']
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {response.status_code for response in answers.values()} == {200}
    assert len({response.content for response in answers.values()}) == 1
    served = sorted(Call.objects.values_list('served_as', flat=True))
    assert served.count('run') == 1 and len(served) == 3  # the others joined it, or found its result


def test_by_default_only_one_users_own_identical_calls_share(
        broker, lanes_redis, tiny_source, make_user, api_as, settings):
    """Nothing a user sees says that someone else sent the same rows lately (docs/operations.md)."""
    settings.HEAVY_LANES_SHARE_ACROSS_USERS = False
    one, two = api_as(make_user()), api_as(make_user())
    assert same(one, tiny_source)[HEADER_DECISION] == 'admitted'
    assert same(two, tiny_source)[HEADER_DECISION] == 'admitted'  # another user: a work of its own
    assert same(one, tiny_source)[HEADER_DECISION] == 'coalesced'  # the same user: its own work
    assert depth(broker) == 2
