"""The skip window closes when Redis answers: after a 0.8 s SIGSTOP of the real Redis, in enforce mode, a user
whose plan allows no heavy call at all (per_user 0) is refused again within 1.5 s of Redis answering, not
admitted uncounted for the rest of the window (CAPACITY_REDIS_RETRY_SECONDS, 15 s): each API process's probe
(capacity.breaker) sees Redis answer and closes its window. Without the probe (CAPACITY_REDIS_PROBE_SECONDS=0)
416 calls were admitted uncounted after those 1.5 s in one run; with it, none."""
import time

import pytest

from tests.integration.faults.load import Load
from tests.integration.workers.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]
PAUSE_SECONDS = 0.8
CLOSED_WITHIN = 1.5  # the acceptance bound: uncounted admissions stop this soon after Redis answers
AFTER_SECONDS = 5  # the load goes on this long after the pause, well inside the 15 s window


def test_after_a_redis_pause_admissions_are_counted_again_within_a_second_and_a_half(
        fault_stack, configure, tiny_source, make_user):
    none = {'staff': 0, 'core': 0, 'early_access': 0, 'preview': 0}
    configure(mode='enforce', enforce_for='all', per_user=none, cache={'ttl_seconds': 0})
    fault_stack.common.update(CAPACITY_REDIS_RETRY_SECONDS='15', CAPACITY_REDIS_PROBE_SECONDS='0.5')
    urls = [fault_stack.api('api-a', threads=8), fault_stack.api('api-b', threads=8)]
    users = [make_user() for _ in range(4)]
    load = Load(urls, [user.auth_token.key for user in users], tiny_source, pause=0.02).start()
    try:
        wait_until(lambda: sum(a.status == 429 for a in list(load.answers)) >= 20, timeout=30, interval=0.1,
                   message='the plan to refuse every call')
        paused = time.monotonic()
        fault_stack.pause_redis(PAUSE_SECONDS)
        resumed = time.monotonic()
        time.sleep(AFTER_SECONDS)
    finally:
        load.stop()
    answers = list(load.answers)
    assert not [a.error for a in answers if a.error]
    before = [a for a in answers if a.sent + a.took < paused]
    assert before and {(a.status, a.decision) for a in before} == {(429, 'refused')}
    # The pause was met: calls went ahead uncounted (a limiter failure never refuses).
    uncounted = [a for a in answers if a.decision == 'unavailable']
    assert uncounted and {a.status for a in uncounted} <= {202, 503}
    # ...and only until a probe saw Redis answer.
    late = [a for a in uncounted if a.sent > resumed + CLOSED_WITHIN]
    assert late == [], [round(a.sent - resumed, 2) for a in late]
    after = [a for a in answers if a.sent > resumed + CLOSED_WITHIN]
    assert len(after) >= 20 and {(a.status, a.decision) for a in after} == {(429, 'refused')}
    last = max(a.sent + a.took for a in uncounted)
    print(f'uncounted admissions: {len(uncounted)}, the last answered {last - resumed:+.2f} s after Redis '
          f'answered; answers after {CLOSED_WITHIN} s: {len(after)}, all refused')
