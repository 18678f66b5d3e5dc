"""HTTP tests of the heavy-call API in process (the broker is the real Redis, db 14); a test that needs its
call to run asks for Celery's in-process worker or real worker processes."""
from tests.integration.workers.conftest import (  # noqa: F401  (shared fixtures)
    api_as, broker, celery_app, celery_worker_parameters, configure, in_process_worker, lanes_redis, start_worker,
    tiny_source,
)
