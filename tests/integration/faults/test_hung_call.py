"""A pool process stopped mid-call (SIGSTOP: it holds its slot and makes no progress, its own heartbeat
thread stopped with it) keeps its call counted in its lanes until its slot is freed: the node's main process
renews the call's leases and beats its row (workers.slots) while the process exists, and the hard time limit
frees the slot (the process killed, the call failed, its leases released). Before, the leases expired
`lease_seconds` after the stop while the slot stayed taken until the hard limit, uncounted."""
import os
import signal
import time

import pytest
import requests

from capacity.constants import Lane
from capacity.keys import lane_key
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
LEASE_SECONDS, RENEW_SECONDS, MAX_HOLD_SECONDS = 15, 2, 25  # hard limit: max_hold + renew = 27 s


def alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except OSError:
        return False


def test_a_stopped_pool_process_keeps_its_call_counted_until_the_hard_limit_frees_its_slot(
        fault_stack, configure, tiny_source, make_user):
    configure(lease_seconds=LEASE_SECONDS, renew_seconds=RENEW_SECONDS, max_hold_seconds=MAX_HOLD_SECONDS)
    url = fault_stack.api('api-a')
    worker = fault_stack.worker(name='knn', queues=('es2_knn',))
    token = make_user().auth_token.key
    answer = requests.post(f'{url}/concepts/$match/?semantic=true&reranker=true&limit=100',
                           json={'rows': LONG_ROWS, 'target_repo_url': tiny_source},
                           headers={'Authorization': f'Token {token}', 'Prefer': 'respond-async'}, timeout=60)
    assert answer.status_code == 202, answer.text
    work_id = answer.json()['id']
    work = wait_until(lambda: Work.objects.filter(pk=work_id, state='running').first(), timeout=60,
                      interval=0.02, message='the call to start')
    pid = int(work.worker.rsplit(' ', 1)[1])
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    lanes = fault_stack.lanes()
    key = lane_key(Lane.ES2_KNN)
    uncounted = []  # moments (s after the stop) when the stopped process held its slot and no lease counted it
    try:
        while alive(pid) and time.monotonic() - stopped < MAX_HOLD_SECONDS + 15:
            now_ms = int(float('.'.join(str(part) for part in lanes.time())) * 1000)
            score = lanes.zscore(key, work_id)
            if (score is None or score <= now_ms) and alive(pid) and Work.objects.filter(
                    pk=work_id, state='running').exists():  # not killed at its hard limit and ended just now
                uncounted.append(round(time.monotonic() - stopped, 2))
            time.sleep(0.1)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    freed = time.monotonic() - stopped
    assert uncounted == []
    # The hard limit freed the slot: the process was killed, the call failed with that reason, its leases
    # went back, and its row was beaten meanwhile (no sweep took it for a dead node's).
    assert LEASE_SECONDS < freed <= MAX_HOLD_SECONDS + RENEW_SECONDS + 5, freed
    work = wait_until(lambda: Work.objects.filter(pk=work_id, state='failed').first(), timeout=10,
                      message='the call to end at its hard limit')
    assert 'hard time limit' in work.error and work.attempts == 1
    wait_until(lambda: fault_stack.leases() == 0, timeout=10, interval=0.2, message='no lease left')
    assert 'keep the running works' not in worker.output()  # the keeper never failed
    lanes.close()
