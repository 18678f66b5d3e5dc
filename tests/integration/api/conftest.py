"""HTTP tests of the heavy-call API in process (the broker is the real Redis, db 14); a test that needs its
call to run asks for Celery's in-process worker or real worker processes."""
import pytest

from tests.integration.workers.conftest import (  # noqa: F401  (shared fixtures)
    api_as, broker, celery_app, celery_worker_parameters, configure, in_process_worker, lanes_redis, start_worker,
    tiny_source,
)


@pytest.fixture(params=['sqlite', pytest.param('postgres', marks=pytest.mark.postgres)])
def each_database(request, settings):
    """Run the test on both databases: on SQLite in `make test`'s first pass, on PostgreSQL in its second
    (the `postgres` marker). Each pass deselects the other's case; run by hand, it is skipped."""
    vendor = 'sqlite' if settings.DATABASES['default']['ENGINE'].endswith('sqlite3') else 'postgres'
    if vendor != request.param:
        pytest.skip(f'runs in the {request.param} pass of make test')
    return vendor
