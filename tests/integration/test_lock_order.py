"""A lock read under takes the database connection first (common.database.locked_with_connection): the
config cache, a source's measured candidate sizes and the index build use it. The stall the other order
caused with a pool of connections is tests/integration/capacity/test_config_pool.py (PostgreSQL)."""
import threading

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from common.database import locked_with_connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_thread_has_its_connection_before_it_waits_for_the_lock():
    lock = threading.Lock()
    opened, inside = threading.Event(), threading.Event()

    def on_created(sender, connection, **kwargs):
        if threading.current_thread().name == 'waiter':
            opened.set()

    def waiter():
        try:
            with locked_with_connection(lock):
                inside.set()
        finally:
            connection.close()

    connection_created.connect(on_created)
    try:
        with lock:  # another thread holds it: the waiter connects, then waits
            thread = threading.Thread(target=waiter, name='waiter')
            thread.start()
            assert opened.wait(10)
            assert not inside.is_set()
        thread.join(10)
    finally:
        connection_created.disconnect(on_created)
    assert inside.is_set()

