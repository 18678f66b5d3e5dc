"""Time limits on real workers: a call stopped at its soft limit and one killed at its hard limit both end
`failed` saying why, with their leases released, and neither message is delivered again."""
import os
import signal
import time

import pytest
from django.conf import settings

from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import holds, poll, running_pid, submit_long
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def unacked(broker):
    return broker.hlen(settings.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix'] + 'unacked')


def gone(pid):
    """The process ended (a zombie not yet reaped by its parent counts as ended)."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except FileNotFoundError:
        return True


def test_calls_past_their_soft_and_hard_time_limits_end_failed_and_are_not_delivered_again(
        broker, start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(lease_seconds=15, renew_seconds=5, max_hold_seconds=15)  # soft 15 s, hard 20 s
    start_worker(name='limits', queues=('es2_knn',), concurrency=2)  # pool 2 (es2_knn 3 - reserve 1)
    client = api_as(make_user())
    soft_id, hard_id = submit_long(client, tiny_source), submit_long(client, tiny_source)
    # A stopped pool process is a call that hangs: it neither finishes nor renews its leases.
    pids = {call_id: running_pid(call_id) for call_id in (soft_id, hard_id)}
    time.sleep(0.3)  # into the work (about 2 s of it)
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    started = Work.objects.get(pk=soft_id).started_at.timestamp()
    # Between the limits the first one is let go on: it finds SoftTimeLimitExceeded raised in the call.
    time.sleep(max(0.0, started + 16.5 - time.time()))
    os.kill(pids[soft_id], signal.SIGCONT)

    soft = poll(client, soft_id, timeout=10).json()
    assert soft['state'] == 'failed'
    assert soft['error'] == ('The call was stopped by its time limit (15 s, max_hold_seconds) and did not '
                             'finish.')
    hard = poll(client, hard_id, timeout=15).json()
    assert hard['state'] == 'failed'
    assert 'stopped by its hard time limit (20 s)' in hard['error']
    call = Work.objects.get(pk=hard_id)
    assert 19 <= (call.finished_at - call.started_at).total_seconds() < 24
    assert holds(lanes_redis, soft_id) == 0 and holds(lanes_redis, hard_id) == 0
    wait_until(lambda: gone(pids[hard_id]), timeout=5, message='the hard-limited pool process to be killed')

    time.sleep(2)  # long enough for a rejected message to be delivered again and picked up
    assert unacked(broker) == 0
    assert {c.pk: (c.state, c.attempts) for c in Work.objects.filter(pk__in=pids)} == {
        soft_id: ('failed', 1), hard_id: ('failed', 1)}

