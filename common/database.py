"""What counts as "the database can't serve now", for the API's 503 and the worker's retry; the order in which
a thread takes a lock and a database connection."""
from contextlib import contextmanager

from django.db import InterfaceError, InternalError, OperationalError

# SQLite's "database or disk is full" and "attempt to write a readonly database" are OperationalError;
# PostgreSQL's disk full is OperationalError and a read-only transaction InternalError; a lost connection
# is InterfaceError or OperationalError. An IntegrityError or a ProgrammingError is a bug or a race, not this.
DATABASE_DOWN = (OperationalError, InternalError, InterfaceError)


def drop_broken_connections():
    """Close this thread's database connections that failed and can't be used any more (ended by the server:
    a restart, a failover, an administrator), as Django does before and after each request; the next query
    opens a new one. A worker keeps its connection from task to task (CELERY_DB_REUSE_MAX), and Celery then
    never looks at it: one ended by the server failed every later task of the process."""
    from django.db import connections
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred:
            continue
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()


_inherited = []  # connections a forked process found from its parent: kept, never closed (see below)


def forget_inherited_connections():
    """In a process just forked from a worker: let go of every database connection of the parent without
    a byte on its socket, so that the first query opens this process's own. Celery's fixup does this too,
    but it stops at a connection psycopg finds lost ('the connection is lost' while reading its fileno),
    and the pool process then went on with its parent's session: two processes on one PostgreSQL session,
    a transaction of one left open with its row locks, and every write to those rows waiting behind it.
    The fd is closed when it can be read; the connection object is kept alive so that its finalizer never
    sends a Terminate on a socket that is the parent's (or, once closed, someone else's)."""
    import os

    from django.db import connections
    for conn in connections.all(initialized_only=True):
        inherited = conn.connection
        if inherited is None:
            continue
        _inherited.append(inherited)
        try:
            os.close(inherited.fileno())
        except Exception:  # noqa: BLE001 - lost already: nothing of ours to close
            pass
        conn.connection = None
        conn.in_atomic_block = conn.needs_rollback = conn.closed_in_transaction = conn.errors_occurred = False
        conn.savepoint_ids = []


@contextmanager
def locked_with_connection(lock):
    """Hold `lock` for a block that may use the database, this thread's connection taken first.

    Always a connection, then the lock: never the other way round. An API process borrows its connections
    from a pool (DATABASE_POOL_SIZE), and a request thread keeps the one it borrowed until its request
    ends. A thread that took a lock first and then waited for a connection, while the threads holding
    every connection of the pool waited for that lock, stopped them all for the pool's timeout (20 s), and
    the request that waited answered 503: seen under a bulk flood, when the config cache expired (capacity
    config). A connection that can't be had now is left for the block to find out (it fails open, or
    raises, as it would have)."""
    from django.db import connection
    try:
        connection.ensure_connection()
    except DATABASE_DOWN:
        pass
    with lock:
        yield
