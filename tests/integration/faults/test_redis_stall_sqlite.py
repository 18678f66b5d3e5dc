"""How long a submission takes while Redis is stopped, on the embedded SQLite of `make run`.

The lanes and the broker (one redis-server) are stopped with SIGSTOP for 20 s under six clients that keep
submitting through two gunicorn API processes. On PostgreSQL each submission is answered within the
limiter's deadline plus the publish deadline (test_redis_pause.py). SQLite writes one transaction at a
time, and a submission's transaction holds the write lock while its message is published
(workers.lifecycle.enqueue: the row and its message together, up to the publish deadline). Waiters are not
served in order, so in a stall a submission may wait for the lock up to SQLite's busy timeout (20 s,
api/settings.py), then publish: the bound is the limiter's deadline, the busy timeout and the publish
deadline; one that never gets the lock is a 503 `database_unavailable`. docs/api.md gives the bound and
what this test measured.
"""
import time

import pytest
from django.conf import settings
from django.db import connection

from tests.integration.faults.load import Load
from tests.integration.workers.conftest import wait_until
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
CLIENTS = 6
STALL_SECONDS = 20
RETRY_SECONDS = 3
SLACK_SECONDS = 1.5  # a loaded 2-core machine


def sqlite_bound():
    """The limiter's deadline, the wait for SQLite's write lock (its busy timeout), the publish deadline."""
    busy = settings.DATABASES['default']['OPTIONS']['timeout']
    return (settings.CAPACITY_REDIS_DEADLINE_SECONDS + busy + settings.CELERY_PUBLISH_DEADLINE_SECONDS
            + SLACK_SECONDS)


def test_a_20_s_redis_stall_on_sqlite_answers_every_submission_within_the_sqlite_bound(
        fault_stack, configure, tiny_source, make_user):
    if connection.vendor != 'sqlite':
        pytest.skip('measures the embedded SQLite (make run); PostgreSQL: test_redis_pause.py')
    configure(cache={'ttl_seconds': 0})
    fault_stack.common['CAPACITY_REDIS_RETRY_SECONDS'] = RETRY_SECONDS
    urls = [fault_stack.api('api-a', threads=8), fault_stack.api('api-b', threads=8)]
    fault_stack.worker(name='knn', queues=('es2_knn',))
    users = [make_user() for _ in range(CLIENTS)]
    load = Load(urls, [user.auth_token.key for user in users], tiny_source).start()
    try:
        wait_until(lambda: Work.objects.filter(state='succeeded').count() >= 10, timeout=60, interval=0.2,
                   message='the load to run calls')
        paused = time.monotonic()
        fault_stack.pause_redis(STALL_SECONDS)
        resumed = time.monotonic()
        time.sleep(RETRY_SECONDS + 4)  # past every process's skip window
    finally:
        load.stop()
    answers = list(load.answers)
    assert not [answer for answer in answers if answer.error], [a.error for a in answers if a.error][:5]
    during = [answer for answer in answers if answer.sent <= resumed and answer.sent + answer.took >= paused]
    slowest = max(answers, key=lambda answer: answer.took)
    kinds = {}
    for answer in during:
        kinds.setdefault((answer.status, answer.error_code), []).append(answer.took)
    print(f'{len(answers)} submissions; during the stall: ' + ', '.join(
        f'{status} {code or ""}: {len(took)}, {min(took):.1f}-{max(took):.1f} s'
        for (status, code), took in sorted(kinds.items(), key=str)) + f'; bound {sqlite_bound():.1f} s')
    assert {answer.status for answer in answers} <= {202, 429, 503}
    assert {answer.error_code for answer in answers if answer.status == 503} <= {
        'queue_unavailable', 'database_unavailable'}
    assert any(answer.status == 503 for answer in during)  # the stall was met: submissions couldn't be queued
    assert slowest.took <= sqlite_bound(), (slowest, sqlite_bound())
