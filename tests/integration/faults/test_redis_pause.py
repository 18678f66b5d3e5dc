"""The real Redis (the lanes and the broker, one redis-server) stopped with SIGSTOP for 0.5, 2, 5 and 20 s
under a steady load of submissions from several clients, through two gunicorn API processes onto a real
prefork lane worker, in enforce mode, with beat sweeping. Once the calls have ended, a user finds: every
submission was answered, within the documented bound (the limiter's deadline plus the publish deadline:
docs/api.md); a 503 says the queue was unavailable and left nothing behind; every call that answered 202
ended, none `queued`, none run twice, each with one result; no lease is left in any lane; and no call was
admitted into a lane already holding its limit of counted calls.

On PostgreSQL, the production database (the `postgres` pass of `make test`): the bound is a request's own.
The embedded SQLite takes one write at a time, and a submission's transaction holds it while it publishes,
so in a stall submissions wait for each other's publish deadline there (docs/api.md).
"""
import time

import pytest
from django.conf import settings
from django.db import connection
from django_celery_results.models import TaskResult

from tests.integration.faults.load import FINAL, Load, capacity_lines, over_admissions, wait_all_ended
from tests.integration.workers.conftest import wait_until
from workers.models import Call, Work

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]
WIDE = {'staff': 40, 'core': 40, 'early_access': 40, 'preview': 40}
RETRY_SECONDS = 3  # CAPACITY_REDIS_RETRY_SECONDS of every stack process: the skip window after an error
DEADLINE_SECONDS = 30  # queue.deadline_seconds
LEASE_SECONDS = 15
SWEEP_SECONDS = 1
CLIENTS = 6
SLACK_SECONDS = 1.5  # a loaded 2-core machine on top of the documented bound


def bound():
    """How long a submission may take while Redis doesn't answer (docs/api.md, 503): the limiter's deadline
    (once per skip window) plus the publish deadline."""
    return settings.CAPACITY_REDIS_DEADLINE_SECONDS + settings.CELERY_PUBLISH_DEADLINE_SECONDS + SLACK_SECONDS


@pytest.fixture
def stack(fault_stack, configure):
    if connection.vendor != 'postgresql':
        pytest.skip('the submission bound is measured on PostgreSQL (HEAVY_LANES_TEST_ON_POSTGRES=1)')
    # es2_knn: 3, so bulk calls may hold 2 leases there plus 2 waiting in the queue (a pool of 2): the load
    # keeps the lane full and a share of the submissions is refused (429).
    configure(mode='enforce', enforce_for='all', es2_knn=3, api_heavy={'cluster': 8, 'per_task': 40},
              tiers=WIDE, per_user=WIDE, cache={'ttl_seconds': 0}, lease_seconds=LEASE_SECONDS,
              renew_seconds=5,
              queue={'deadline_seconds': DEADLINE_SECONDS, 'max_waiting': {'es2_knn': 2}})
    fault_stack.common['CAPACITY_REDIS_RETRY_SECONDS'] = RETRY_SECONDS
    return fault_stack


@pytest.mark.parametrize('seconds', [0.5, 2, 5, 20])
def test_a_redis_pause_under_load_loses_nothing_leaks_nothing_and_runs_nothing_twice(
        stack, tiny_source, make_user, seconds):
    urls = [stack.api('api-a', threads=8), stack.api('api-b', threads=8)]
    worker = stack.worker(name='knn', queues=('es2_knn',))
    maintenance = stack.maintenance(sweep_seconds=SWEEP_SECONDS, grace_seconds=3)
    wait_until(lambda: (stack.status()['queues']['es2_knn']['workers'].get(worker.node) or {}).get(
        'processes') == 2, timeout=30, interval=0.2, message='a pool of two')
    users = [make_user() for _ in range(CLIENTS)]
    load = Load(urls, [user.auth_token.key for user in users], tiny_source).start()
    try:
        wait_until(lambda: Work.objects.filter(state='succeeded').count() >= 10, timeout=60,
                   interval=0.2, message='the load to run calls')
        paused = time.monotonic()
        stack.pause_redis(seconds)
        resumed = time.monotonic()
        time.sleep(RETRY_SECONDS + 4)  # the load goes on past every process's skip window
    finally:
        load.stop()
    answers = list(load.answers)
    ids = [answer.call_id for answer in load.accepted()]

    # Every submission was answered, as 202, 429 or 503, within the bound; a 503 says the queue was down.
    assert not [answer for answer in answers if answer.error], [a.error for a in answers if a.error][:5]
    assert {answer.status for answer in answers} <= {202, 429, 503}, {answer.status for answer in answers}
    assert {answer.error_code for answer in answers if answer.status == 503} <= {'queue_unavailable'}
    slowest = max(answers, key=lambda answer: answer.took)
    assert slowest.took <= bound(), (slowest, bound())
    # The pause was met (calls went ahead uncounted, or couldn't be queued) and counting resumed after it.
    during = [a for a in answers if paused <= a.sent + a.took and a.sent <= resumed]
    assert any(a.status == 503 or a.decision == 'unavailable' or a.took >= 0.8 * min(seconds, 1)
               for a in during)
    after = [a for a in answers if a.sent > resumed + RETRY_SECONDS + 1]
    assert after and {a.decision for a in after} <= {'admitted', 'refused'}, [a.decision for a in after]

    # Every call that answered 202 ends: it runs, or expires at its deadline; none is left queued.
    wait_all_ended(ids, timeout=DEADLINE_SECONDS + 15, late_seconds=3 * SWEEP_SECONDS)
    calls = list(Work.objects.filter(calls__owner__in=users).distinct())
    assert sorted(call.pk for call in calls) == sorted(ids)  # a row for each 202 and none for a 503
    states = {call.pk: call.state for call in calls}
    assert set(states.values()) <= {'succeeded', 'expired'}, states
    if seconds < DEADLINE_SECONDS / 2:
        assert set(states.values()) == {'succeeded'}, states

    # None ran twice: one claim of each by a worker, one result, one log line of its end.
    assert [call.pk for call in calls if call.attempts > 1] == []
    succeeded = [call.pk for call in calls if call.state == 'succeeded']
    assert all(call.attempts == 1 for call in calls if call.state == 'succeeded')
    results = TaskResult.objects.filter(task_id__in=ids)
    assert sorted(results.values_list('task_id', flat=True)) == sorted(succeeded)
    ends = {}
    for line in capacity_lines([worker, maintenance, *stack.apis]):
        if line.get('task_id') in states and line.get('state') in FINAL:
            ends[line['task_id']] = ends.get(line['task_id'], 0) + 1
    assert ends == dict.fromkeys(states, 1)

    # No lease is left: not one unexpired lease, soon after the last call ended, and none that expired
    # without a release (shorter stalls than a lease expire none: a count of them is a leak).
    wait_until(lambda: stack.leases() == 0, timeout=8, interval=0.2,
               message=f'no lease left: {stack.lease_members()}')
    left, expired = stack.lease_members()
    assert left == {}
    if seconds < LEASE_SECONDS:
        assert expired == 0
    # No call was admitted into a lane that already held its limit of counted calls (the load kept it
    # full: a share of the submissions was refused).
    assert any(answer.status == 429 for answer in answers)
    assert over_admissions(Call.objects.filter(work__in=calls).select_related('work')) == []
    # Nothing is left on the broker. A publish that landed after its API gave up (503) is a message without a
    # row: a worker drops it once the row can't come any more (ROW_WAIT_SECONDS).
    wait_until(lambda: stack.messages() == set(), timeout=20, interval=0.5, message='an empty broker')
