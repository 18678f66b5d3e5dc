"""On PostgreSQL, a worker's claim and a success are one statement each (workers.lifecycle.statements);
elsewhere the ORM takes several. Both paths, side by side on the same database, write the same rows.

    HEAVY_LANES_TEST_ON_POSTGRES=1 .venv/bin/python -m pytest -m postgres tests/integration/workers
"""
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.conftest import missing_service
from tests.integration.workers.test_lifecycle import queued, quiet  # noqa: F401 - quiet is autouse
from workers import lifecycle
from workers.lifecycle import statements
from workers.models import HeavyCall, State

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]
RESULT_FIELDS = ('status', 'result', 'content_type', 'content_encoding', 'meta', 'task_name', 'worker',
                 'task_args', 'task_kwargs')


@pytest.fixture(params=['one statement', 'orm'])
def path(request, monkeypatch):
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    if request.param == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
    else:
        assert statements.available()
    return request.param


def test_a_claim_marks_the_call_and_its_queued_followers_running_and_wins_once(path, make_user, lanes):
    user = make_user()
    leader = queued(user, work_key='w' * 64)
    waiting = queued(user, leader=leader, served_as='coalesced')
    gone = queued(user, leader=leader, served_as='coalesced', state=State.CANCELLED)
    twin = HeavyCall.objects.get(pk=leader.pk)

    assert lifecycle.start(leader, 'w@a pid 1').kind == lifecycle.RUN

    row = HeavyCall.objects.get(pk=leader.pk)
    assert (row.state, row.attempts, row.worker) == (State.RUNNING, 1, 'w@a pid 1')
    assert row.started_at == row.heartbeat_at == leader.started_at
    follower = HeavyCall.objects.get(pk=waiting.pk)
    assert (follower.state, follower.started_at, follower.attempts) == (State.RUNNING, row.started_at, 0)
    assert HeavyCall.objects.get(pk=gone.pk).state == State.CANCELLED  # a follower that ended stays ended
    assert lifecycle.start(twin, 'w@b pid 2').kind == lifecycle.BUSY  # read before the claim: it lost
    assert HeavyCall.objects.get(pk=leader.pk).worker == 'w@a pid 1'


def test_a_success_writes_the_state_and_the_result_row_as_the_backend_would(path, make_user, lanes):
    from celery import states
    from django_celery_results.models import TaskResult

    from workers.celery import app
    result = [{'row': {'name': 'chest pain'}, 'results': [{'id': 'HP:1', 'search_meta': {'score': 1}}]}]
    call = queued(make_user())
    assert not lifecycle.succeed(call, result)  # never started: nothing written
    lifecycle.start(call, 'w@me pid 1')
    assert not lifecycle.succeed(call, result, worker='w@other pid 9')  # not its run
    assert not TaskResult.objects.filter(task_id=call.pk).exists()

    assert lifecycle.succeed(call, result, worker='w@me pid 1')

    row = HeavyCall.objects.get(pk=call.pk)
    assert (row.state, row.finished_at, row.error) == (State.SUCCEEDED, call.finished_at, '')
    assert json.loads(call.result_text) == result and call.work_result_text == call.result_text
    app.backend.store_result('by-backend', result, states.SUCCESS)
    ours, theirs = (TaskResult.objects.values(*RESULT_FIELDS).get(task_id=i) for i in (call.pk, 'by-backend'))
    assert ours == theirs
    stored = TaskResult.objects.get(task_id=call.pk)
    assert stored.date_done is not None and stored.date_created is not None
    assert lifecycle.result(row) == result
    assert not lifecycle.succeed(call, {'n': 2}, worker='w@me pid 1')  # ended: once
    assert lifecycle.result(HeavyCall.objects.get(pk=call.pk)) == result


def test_a_detached_leaders_success_is_stored_for_its_followers_only(path, make_user, lanes):
    call = queued(make_user())
    lifecycle.start(call, 'w@me pid 1')
    HeavyCall.objects.filter(pk=call.pk).update(detached_at=timezone.now() - timedelta(seconds=1))

    assert lifecycle.succeed(call, {'n': 1}, worker='w@me pid 1')

    assert call.result_text is None and json.loads(call.work_result_text) == {'n': 1}
    assert HeavyCall.objects.get(pk=call.pk).state == State.SUCCEEDED
