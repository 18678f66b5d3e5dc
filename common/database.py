"""What counts as "the database can't serve now", for the API's 503 and the worker's retry."""
from django.db import InterfaceError, InternalError, OperationalError

# SQLite's "database or disk is full" and "attempt to write a readonly database" are OperationalError;
# PostgreSQL's disk full is OperationalError and a read-only transaction InternalError; a lost connection
# is InterfaceError or OperationalError. An IntegrityError or a ProgrammingError is a bug or a race, not this.
DATABASE_DOWN = (OperationalError, InternalError, InterfaceError)
