"""A starved API host keeps the limits: one user's flood into one API process of 64 threads, in enforce mode
with a per-user limit of 2, while that process is stopped (SIGSTOP) twice for 1.5 s, longer than the limiter's
deadline, with Redis answering throughout. Every answer Redis gave waited in the process's sockets and counts:
no call goes ahead uncounted (`unavailable`), and exactly two are admitted (no worker runs them, so they keep
their slots). Before the fix this flood admitted calls `unavailable`: half of the process's threads queued
their operations behind its one Redis thread past the deadline, and each miss opened the skip window for
every call of the process (issue 42, item 1: 207 of one user's calls admitted uncounted in 30 s).
"""
import collections
import os
import signal
import time

import pytest

from tests.integration.faults.load import Load
from tests.integration.workers.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]
CLIENTS = 120
STOP_SECONDS = 1.5  # past the 1 s deadline (CAPACITY_REDIS_DEADLINE_SECONDS)


def worker_pids(master_pid):
    with open(f'/proc/{master_pid}/task/{master_pid}/children') as listing:
        return [int(child) for child in listing.read().split()]


def test_a_flood_into_a_starved_api_process_is_refused_past_the_limit_and_never_admitted_uncounted(
        fault_stack, configure, tiny_source, make_user):
    two = {'staff': 2, 'core': 2, 'early_access': 2, 'preview': 2}
    configure(mode='enforce', enforce_for='all', per_user=two, cache={'ttl_seconds': 0})
    url = fault_stack.api('api-a', threads=64)
    user = make_user(group='core_user')
    load = Load([url], [user.auth_token.key] * CLIENTS, tiny_source, pause=0.0).start()
    try:
        wait_until(lambda: sum(a.status == 429 for a in list(load.answers)) >= 100, timeout=60, interval=0.1,
                   message='the flood to be refused')
        (pid,) = worker_pids(fault_stack.apis[0].process.pid)
        for _ in range(2):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(STOP_SECONDS)  # the fault itself: no condition to wait for while the process is stopped
            os.kill(pid, signal.SIGCONT)
            served = len(load.answers)
            wait_until(lambda: len(load.answers) >= served + 200, timeout=60, interval=0.1,  # noqa: B023
                       message='the process to answer again')
    finally:
        load.stop()
    answers = list(load.answers)
    decisions = collections.Counter(answer.decision for answer in answers)
    assert not [answer.error for answer in answers if answer.error]
    assert decisions['unavailable'] == 0, decisions
    assert set(decisions) <= {'admitted', 'refused', 'coalesced'}, decisions
    assert decisions['admitted'] == 2, decisions  # the user's limit, exactly
    assert {answer.status for answer in answers} <= {202, 429}
    print(f'{len(answers)} answers: {dict(decisions)}')
