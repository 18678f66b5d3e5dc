"""On PostgreSQL, a first delivery claims its work and reads it back with its first call in one statement
(workers/lifecycle/sql/claim_first.sql); elsewhere the ORM takes two. Both paths, side by side on the same
database, claim the same way and read the same rows. Likewise a new work and its first call are written in
one execute (statements.insert) or, elsewhere, two: the same rows, the same errors. And a success is recorded
in one statement (workers/lifecycle/sql/succeed.sql) or a transaction through django-celery-results' backend:
the same work row, the same result row.

    HEAVY_LANES_TEST_ON_POSTGRES=1 .venv/bin/python -m pytest -m postgres tests/integration/workers
"""
import json
import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.db import DataError, IntegrityError, connection
from django.utils import timezone

from tests.conftest import missing_service
from tests.integration.workers.test_lifecycle import another, queued, quiet  # noqa: F401 - quiet is autouse
from workers import lifecycle
from workers.lifecycle import statements
from workers.models import Call, State, Work

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def on_postgres():
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')


def fields(instance):
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


def test_a_first_claim_reads_back_the_claimed_work_and_its_first_call_as_the_orm_reads_them(make_user, lanes):
    user = make_user()
    first = queued(user)
    another(user, first.work)  # a second call changes nothing of the first's read

    claimed = lifecycle.claim_first(first.work_id, 'w@a pid 1')

    assert claimed is not None and claimed.pk == first.pk
    stored = Call.objects.select_related('work').get(pk=first.pk)
    assert fields(claimed) == fields(stored) and fields(claimed.work) == fields(stored.work)
    work = claimed.work
    assert (work.state, work.attempts, work.worker) == (State.RUNNING, 1, 'w@a pid 1')
    assert work.started_at == work.heartbeat_at and work.lease == first.work.lease and work.shared


@pytest.mark.parametrize('fields_of_work', [
    {'state': State.RUNNING, 'attempts': 1},                          # claimed already
    {'attempts': 1},                                                  # delivered before: load and start decide
    {'expires_at': timezone.now() - timedelta(seconds=1)},            # past its queue deadline
    {'state': State.CANCELLED},
])
def test_a_first_claim_claims_only_a_queued_never_delivered_work_before_its_deadline(fields_of_work, make_user,
                                                                                      lanes):
    first = queued(make_user(), **fields_of_work)
    assert lifecycle.claim_first(first.work_id, 'w@a pid 1') is None
    assert fields(Work.objects.get(pk=first.work_id)) == fields(first.work)  # nothing changed


@pytest.mark.parametrize('path', ['one statement', 'orm'])
def test_of_two_claims_one_wins(path, make_user, lanes, monkeypatch):
    first = queued(make_user())
    twin = Work.objects.get(pk=first.work_id)
    if path == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
        assert lifecycle.start(first.work, 'w@a pid 1').kind == lifecycle.RUN
    else:
        assert lifecycle.claim_first(first.work_id, 'w@a pid 1') is not None
    assert lifecycle.claim_first(first.work_id, 'w@b pid 2') is None
    assert lifecycle.start(twin, 'w@b pid 2').kind == lifecycle.BUSY  # read before the claim: it lost
    assert Work.objects.get(pk=first.work_id).worker == 'w@a pid 1'


# A new work's two INSERTs go out as one query string (statements.insert): an error in the second must undo the
# first and reach the caller as Django's, with the connection usable after. Run outside a test transaction
# (transactional_db), as the API runs it.

def new_work(user, key='k', request_id=''):
    work = Work(id=uuid.uuid4().hex, endpoint='$match', queue='es2_knn', payload={'rows': [{'name': 'x'}]},
                expires_at=timezone.now() + timedelta(minutes=10))
    call = Call(id=work.pk, owner=user, endpoint='$match', fingerprint='f', idempotency_key=key,
                request_id=request_id)
    return work, call


# The tests below that enqueue take `key_prefix`: the served call's counter goes under their own prefix, not
# the default one, which nothing would delete from the test Redis.
@pytest.fixture(params=['one execute', 'orm'])
def path(request, monkeypatch):
    if request.param == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
    return request.param


def test_a_new_work_and_its_call_are_written_with_its_message_or_not_at_all(path, transactional_db, make_user,
                                                                           key_prefix):
    user = make_user()
    work, call = new_work(user)
    with pytest.raises(ConnectionError):
        lifecycle.enqueue(work, call, publish=mock.Mock(side_effect=ConnectionError('broker down')))
    assert not Work.objects.exists() and not Call.objects.exists()

    publish = mock.Mock()
    lifecycle.enqueue(*new_work(user), publish=publish)
    stored = Call.objects.select_related('work').get()
    assert publish.call_count == 1 and (stored.work.state, stored.served_as) == (State.QUEUED, 'run')
    assert stored.work.payload == {'rows': [{'name': 'x'}]}


def test_a_second_call_with_the_same_key_is_an_integrity_error_and_writes_nothing(path, transactional_db,
                                                                                 make_user, key_prefix):
    user = make_user()
    first = lifecycle.enqueue(*new_work(user), publish=mock.Mock())
    publish = mock.Mock()
    with pytest.raises(IntegrityError):  # Django's, which the API answers with the earlier call
        lifecycle.enqueue(*new_work(user), publish=publish)
    assert not publish.called
    assert list(Work.objects.values_list('pk', flat=True)) == [first.work_id]  # its work was rolled back too
    assert Call.objects.filter(owner=user, idempotency_key='k').get().pk == first.pk  # the connection works


def test_a_value_the_database_cant_store_is_a_data_error_and_writes_nothing(path, transactional_db, make_user,
                                                                           key_prefix):
    user = make_user()
    with pytest.raises(DataError):  # the API's 400
        lifecycle.enqueue(*new_work(user, request_id='r' * 101), publish=mock.Mock())
    assert not Work.objects.exists() and not Call.objects.exists()
    lifecycle.enqueue(*new_work(user), publish=mock.Mock())
    assert Call.objects.count() == 1


# A success is recorded in one statement on PostgreSQL (workers/lifecycle/sql/succeed.sql) and in a transaction
# through django-celery-results' backend elsewhere: the same work row, the same result row as the backend's own.

def task_request(work_id):
    """What Celery's request of a heavy call's task holds when the worker stores its result."""
    from celery.app.task import Context
    return Context(id=work_id, task='heavy_lanes.run_heavy_call', argsrepr=repr([work_id]),
                   kwargsrepr=repr({'node': 'es2_knn@a'}), hostname='es2_knn@a', meta={'x': 1})


RESULT_COLUMNS = ('status', 'result', 'content_type', 'content_encoding', 'meta', 'traceback', 'periodic_task_name',
                  'task_name', 'task_args', 'task_kwargs', 'worker')


@pytest.mark.parametrize('path', ['one statement', 'orm'])
def test_a_success_stores_the_result_row_the_backend_stores_and_reads_back_its_holders(path, make_user, lanes,
                                                                                     monkeypatch):
    import celery
    from celery import states
    from django_celery_results.models import TaskResult

    from workers.celery import app
    if path == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
    user = make_user()
    call = queued(user)
    work = call.work
    lifecycle.start(work, 'w@a pid 1')
    another(user, work)  # joins while it runs: its end counts both calls
    monkeypatch.setattr(celery, 'current_task', mock.Mock(request=task_request(work.pk)))
    result = [{'row': {'name': 'chest pain'}, 'results': [{'id': 'HP:1'}, {'id': 'HP:2'}]}]

    text = lifecycle.succeed(work, result, worker='w@a pid 1')

    app.backend.store_result('by-backend', result, states.SUCCESS, request=task_request('by-backend'))
    ours, theirs = (TaskResult.objects.values(*RESULT_COLUMNS).get(task_id=i) for i in (work.pk, 'by-backend'))
    assert ours == {**theirs, 'task_args': theirs['task_args'].replace('by-backend', work.pk)}
    assert (ours['task_name'], ours['worker']) == ('heavy_lanes.run_heavy_call', 'es2_knn@a')
    assert json.loads(text) == result == app.backend.get_task_meta(work.pk)['result']
    assert (work.holders, work.shared) == (2, True)
    stored = Work.objects.get(pk=work.pk)
    assert (stored.state, stored.finished_at, stored.error, stored.answer_count) == (
        State.SUCCEEDED, work.finished_at, '', 2)


@pytest.mark.parametrize('path', ['one statement', 'orm'])
def test_a_success_of_a_work_no_longer_its_own_changes_nothing(path, make_user, lanes, monkeypatch):
    from django_celery_results.models import TaskResult
    if path == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
    work = queued(make_user()).work
    assert lifecycle.succeed(work, {'n': 1}, worker='w@a pid 1') is None  # still queued
    lifecycle.start(work, 'w@a pid 1')
    assert lifecycle.succeed(work, {'n': 1}, worker='w@b pid 2') is None  # another worker's run
    assert Work.objects.get(pk=work.pk).state == State.RUNNING and not TaskResult.objects.exists()
    assert json.loads(lifecycle.succeed(work, {'n': 1})) == {'n': 1}  # no worker named: any run


@pytest.mark.parametrize('path', ['one statement', 'orm'])
def test_a_success_replaces_an_earlier_result_row_of_its_task(path, make_user, lanes, monkeypatch):
    from celery import states
    from django_celery_results.models import TaskResult

    from workers.celery import app
    if path == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
    work = queued(make_user()).work
    app.backend.store_result(work.pk, ValueError('an earlier delivery'), states.FAILURE, traceback='tb')
    created = TaskResult.objects.get(task_id=work.pk).date_created
    lifecycle.start(work, 'w@a pid 1')
    lifecycle.succeed(work, {'n': 1}, worker='w@a pid 1')
    row = TaskResult.objects.get(task_id=work.pk)
    assert (row.status, json.loads(row.result), row.traceback, row.date_created) == (
        states.SUCCESS, {'n': 1}, None, created)
    assert row.date_done >= created
