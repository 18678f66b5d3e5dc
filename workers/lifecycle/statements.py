"""Two transitions of a call's run, each as one statement on PostgreSQL, where the ORM needs several round
trips: a worker's claim of a queued call with its queued followers (for a first delivery, with the claimed
row read back: `claim_first`, so the worker needn't read it before), and a success with its result row.

Every single-row call pays the worker's own round trips to the database while the next call waits in a
queue behind one process (the interactive lane's pool is `reserve_single_row`, 1 by default), so each one
is queue wait for the calls behind it: measured under the load generator's default mix, the worker's
handoff between one call's end and the next one's start was twice the work itself (docs/benchmarks.md).
Written by hand because Django has no UPDATE ... RETURNING and no way to chain statements in one: both
are data-modifying common table expressions, which PostgreSQL runs atomically as one statement (the
transaction the ORM path opens for the success is no longer needed there). Other databases (the embedded
SQLite) take the ORM path in workers.lifecycle.running; both paths write the same rows, which the tests
check on both.
"""
from django.db import connection

from workers.models import HeavyCall, State


def available():
    return connection.vendor == 'postgresql'


def _q(name):
    return connection.ops.quote_name(name)


def _column(model, name):
    return _q(model._meta.get_field(name).column)


def cast_type(field):
    """The column's type without a length: a value too long then fails the insert, as on the ORM path,
    instead of being cut by the cast."""
    kind = field.db_type(connection)
    return kind.split('(', 1)[0] if kind.startswith('varchar') else kind


def claim_queued(call_id, worker, now):
    """Mark a queued call running on `worker` (a first delivery) and its queued followers with it; whether
    the call was still queued (else nothing changed)."""
    c = lambda name: _column(HeavyCall, name)  # noqa: E731
    table = _q(HeavyCall._meta.db_table)
    sql = (f'WITH claimed AS (UPDATE {table} SET {c("state")} = %s, {c("started_at")} = %s, '
           f'{c("attempts")} = {c("attempts")} + 1, {c("worker")} = %s, {c("heartbeat_at")} = %s '
           f'WHERE {c("id")} = %s AND {c("state")} = %s RETURNING {c("id")}), '
           f'followers AS (UPDATE {table} SET {c("state")} = %s, {c("started_at")} = %s '
           f'WHERE {c("leader")} IN (SELECT {c("id")} FROM claimed) AND {c("state")} = %s) '
           f'SELECT count(*) FROM claimed')
    params = [State.RUNNING, now, worker, now, call_id, State.QUEUED, State.RUNNING, now, State.QUEUED]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0] == 1


def claim_first(call_id, worker, now):
    """A first delivery's claim of its call, read back: mark the call running on `worker` when it is queued,
    was never delivered before (attempts 0) and its queue deadline is ahead, and its queued followers with
    it; the claimed row (a HeavyCall), or None when nothing changed."""
    c = lambda name: _column(HeavyCall, name)  # noqa: E731
    table = _q(HeavyCall._meta.db_table)
    columns = ', '.join(_q(field.column) for field in HeavyCall._meta.concrete_fields)
    sql = (f'WITH claimed AS (UPDATE {table} SET {c("state")} = %s, {c("started_at")} = %s, '
           f'{c("attempts")} = {c("attempts")} + 1, {c("worker")} = %s, {c("heartbeat_at")} = %s '
           f'WHERE {c("id")} = %s AND {c("state")} = %s AND {c("attempts")} = 0 AND {c("expires_at")} > %s '
           f'RETURNING {columns}), '
           f'followers AS (UPDATE {table} SET {c("state")} = %s, {c("started_at")} = %s '
           f'WHERE {c("leader")} IN (SELECT {c("id")} FROM claimed) AND {c("state")} = %s) '
           f'SELECT {columns} FROM claimed')
    params = [State.RUNNING, now, worker, now, call_id, State.QUEUED, now, State.RUNNING, now, State.QUEUED]
    return next(iter(HeavyCall.objects.raw(sql, params)), None)


def succeed_with_result(call_id, worker, finished_at, result_row, update_fields):
    """End a running call `succeeded` and write its result row (`result_row`, an unsaved TaskResult) in one
    statement; None when the call was no longer running (on `worker`, when given: nothing is written),
    else whether it was still its owner's (not detached: see running.succeed)."""
    from django_celery_results.models import TaskResult

    c = lambda name: _column(HeavyCall, name)  # noqa: E731
    calls = _q(HeavyCall._meta.db_table)
    results = _q(TaskResult._meta.db_table)
    fields = [field for field in TaskResult._meta.concrete_fields if not field.primary_key]
    values = [field.get_db_prep_save(field.pre_save(result_row, True), connection) for field in fields]
    selected = ', '.join(f'%s::{cast_type(field)}' for field in fields)
    columns = ', '.join(_q(field.column) for field in fields)
    updates = ', '.join(f'{_column(TaskResult, name)} = EXCLUDED.{_column(TaskResult, name)}'
                        for name in update_fields)
    on_worker = f' AND {c("worker")} = %s' if worker is not None else ''
    sql = (f'WITH done AS (UPDATE {calls} SET {c("state")} = %s, {c("finished_at")} = %s, {c("error")} = %s '
           f'WHERE {c("id")} = %s AND {c("state")} = %s{on_worker} '
           f'RETURNING {c("detached_at")} IS NULL AS owned), '
           f'stored AS (INSERT INTO {results} ({columns}) SELECT {selected} FROM done '
           f'ON CONFLICT ({_column(TaskResult, "task_id")}) DO UPDATE SET {updates}) '
           f'SELECT owned FROM done')
    params = [State.SUCCEEDED, finished_at, '', call_id, State.RUNNING,
              *([worker] if worker is not None else []), *values]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else bool(row[0])
