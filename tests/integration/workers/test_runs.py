"""GET /tasks/?state= filters by what each call's owner sees: workers.runs.state_filter is lifecycle.seen
written as a query, held here against seen itself for a call in every state a call can show."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.integration.workers.test_lifecycle import another, queued, quiet  # noqa: F401  (its fixture)
from workers import lifecycle, runs
from workers.models import Call, State

pytestmark = pytest.mark.django_db


def test_the_state_filter_finds_exactly_the_calls_whose_owner_sees_that_state(make_user, lanes):
    user = make_user()
    now = timezone.now()
    waiting = queued(user, work_key='q' * 64)
    late = queued(user, work_key='l' * 64, expires_at=now - timedelta(seconds=1))  # past its deadline, unswept
    running = queued(user, work_key='r' * 64, state='running', started_at=now, worker='w', heartbeat_at=now)
    joined = another(user, running.work)  # the work runs on for it after its first call is cancelled
    lifecycle.cancel(running)
    done = queued(user, work_key='s' * 64, state='succeeded', started_at=now, finished_at=now)
    warm = another(user, done.work, joined=False)  # answered from the succeeded work's result
    failed = queued(user, work_key='f' * 64, state='failed', started_at=now, finished_at=now, error='boom')
    expired = queued(user, work_key='e' * 64, state='expired', finished_at=now)
    revoked = queued(user, work_key='c' * 64, state='cancelled', finished_at=now)  # its message revoked
    calls = [waiting, late, running, joined, done, warm, failed, expired, revoked]

    def seen_state(call):
        call = Call.objects.select_related('work').get(pk=call.pk)
        return lifecycle.seen(call, lifecycle.expire(call.work)).state

    by_filter = {state: {call.pk for call in runs.listed(owner=user, states=[state])} for state in State.values}
    by_seen = {state: {call.pk for call in calls if seen_state(call) == state} for state in State.values}
    assert by_filter == by_seen
    assert by_seen == {'queued': {waiting.pk}, 'running': {joined.pk}, 'succeeded': {done.pk, warm.pk},
                       'failed': {failed.pk}, 'expired': {late.pk, expired.pk},
                       'cancelled': {running.pk, revoked.pk}}
    assert list(runs.listed(owner=make_user())) == []
