"""A worker keeps its database connection from task to task (CELERY_DB_REUSE_MAX), so Celery never checks
it: before each task the worker drops one that failed and can't be used any more (the server ended it),
instead of failing every later task of the process with "the connection is closed"."""
from unittest import mock

import pytest
from django.db import connection

from workers import signals

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_connection_that_failed_and_is_gone_is_dropped_before_a_task():
    connection.ensure_connection()
    connection.errors_occurred = True
    with mock.patch.object(connection, 'is_usable', return_value=False):
        signals.drop_broken_database_connections()
    assert connection.connection is None
    connection.ensure_connection()  # the next query opens a new one


def test_a_connection_that_failed_but_still_works_is_kept():
    connection.ensure_connection()
    kept = connection.connection
    connection.errors_occurred = True
    signals.drop_broken_database_connections()
    assert connection.connection is kept and not connection.errors_occurred


def test_a_connection_without_errors_is_not_looked_at():
    connection.ensure_connection()
    with mock.patch.object(connection, 'is_usable') as is_usable:
        signals.drop_broken_database_connections()
    is_usable.assert_not_called()


def test_the_main_process_drops_a_broken_connection_before_ending_a_revoked_call():
    # No task runs in a worker's main process, so its revoke handler looks at its own connection first.
    connection.ensure_connection()
    connection.errors_occurred = True
    seen = []
    with mock.patch.object(connection, 'is_usable', return_value=False), \
            mock.patch.object(signals.lifecycle, 'end_unstarted', lambda *a: seen.append(connection.connection)):
        signals.end_revoked(request=mock.Mock(id='c' * 32))
    assert seen == [None]


def test_a_pool_process_lets_go_of_a_parent_connection_even_one_psycopg_finds_lost(monkeypatch):
    # Celery's fixup gives up on it ('the connection is lost' from fileno): the child must not use it.
    from common import database
    lost = mock.Mock()
    lost.fileno.side_effect = OSError('the connection is lost')
    connection.ensure_connection()
    own = connection.connection
    monkeypatch.setattr(database, '_inherited', [])
    connection.connection = lost
    signals.forget_parent_database_connections()
    assert connection.connection is None and database._inherited == [lost]
    lost.close.assert_not_called()  # not a byte on the parent's socket
    own.close()
