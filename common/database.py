"""What counts as "the database can't serve now", for the API's 503 and the worker's retry."""
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
