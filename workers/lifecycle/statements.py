"""The lifecycle's statements written in SQL, one named `.sql` file each under `workers/lifecycle/sql/`, with
a header that says what it does, its parameters and what it returns (as the Lua scripts of capacity/lua/
do). PostgreSQL only: elsewhere the ORM path of workers.lifecycle.running does the same in more round trips,
and the tests compare both.
"""
import functools
import importlib.resources

from django.db import connection
from django.db.models.sql import InsertQuery

from workers.models import TRANSITIONS, Call, State, Work


@functools.cache
def read_statement(name):
    """The SQL of one statement, shipped as package data."""
    return importlib.resources.files('workers.lifecycle').joinpath('sql', f'{name}.sql').read_text(
        encoding='utf-8')


def available():
    return connection.vendor == 'postgresql'


def insert(*instances):
    """INSERT each of `instances` (new, unsaved model instances, their primary keys set), in this order.

    On PostgreSQL, as one query string in one execute (one round trip, where `save()` takes one each), so
    a new work and its first call cost what the durable floor's one row costs: Django's PostgreSQL cursor
    binds parameters on the client, and PostgreSQL runs the statements of one query string in its
    transaction, the first error stopping the rest. The SQL and the values are the ORM's own (its INSERT
    compiler, as `save(force_insert=True)` writes them); no `pre_save`/`post_save` signal is sent (none is
    connected for these models). Elsewhere (the embedded SQLite, in-process: nothing to save), and with
    server-side binding, which takes one statement per execute, each is saved as usual.
    """
    if not available() or connection.settings_dict.get('OPTIONS', {}).get('server_side_binding'):
        for instance in instances:
            instance.save(force_insert=True)
        return
    statements, params = [], []
    for instance in instances:
        query = InsertQuery(type(instance))
        query.insert_values(instance._meta.local_concrete_fields, [instance])
        for statement, values in query.get_compiler(connection=connection).as_sql():
            statements.append(statement)
            params.extend(values)
    with connection.cursor() as cursor:
        cursor.execute('; '.join(statements), params)
    for instance in instances:
        instance._state.adding, instance._state.db = False, connection.alias


def db_now():
    """The database's clock (PostgreSQL's now(): the start of the transaction), which every heartbeat and
    claim is written with; elsewhere (the embedded SQLite, one host) this host's."""
    if not available():
        from django.utils import timezone
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute('SELECT now()')
        return cursor.fetchone()[0]


def claim_first(work_id, worker):
    """claim_first.sql: the claimed Work, running on `worker`, with its first call as `call` — a Call whose
    `work` is that Work — or None when nothing was claimed."""
    with connection.cursor() as cursor:
        cursor.execute(read_statement('claim_first'), {
            'id': work_id, 'worker': worker, 'queued': State.QUEUED, 'running': State.RUNNING})
        row = cursor.fetchone()
        if row is None:
            return None
        names = [column.name for column in cursor.description]
    split = len(Work._meta.concrete_fields)
    work = from_row(Work, names[:split], row[:split])
    call = from_row(Call, names[split:], row[split:])
    call.work = work
    return call


def succeed(work_id, worker, finished_at, answer_count, result_row):
    """succeed.sql: move the work `work_id` to succeeded (only while it runs on `worker`, if given) and store
    its result row (`result_row`: its columns, workers.lifecycle.running.result_row) with it; the work's
    (holders, shared) as it ended, or None when nothing changed."""
    transition = TRANSITIONS['succeed']
    with connection.cursor() as cursor:
        cursor.execute(read_statement('succeed'), {
            **result_row, 'id': work_id, 'sources': list(transition.source), 'target': transition.target,
            'any_worker': not worker, 'worker': worker or '', 'finished_at': finished_at,
            'answer_count': answer_count})
        return cursor.fetchone()


def from_row(model, columns, values):
    """A model instance from raw columns (by column name, in any order), converted as the ORM would."""
    by_column = {field.column: field for field in model._meta.concrete_fields}
    values_by_name = {}
    for column, value in zip(columns, values):
        field = by_column[column]
        converters = connection.ops.get_db_converters(field.cached_col) + field.get_db_converters(connection)
        for converter in converters:
            value = converter(value, field.cached_col, connection)
        values_by_name[field.attname] = value
    names = [field.attname for field in model._meta.concrete_fields]
    return model.from_db(connection.alias, names, [values_by_name[name] for name in names])
