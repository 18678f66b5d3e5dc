"""HTTP tests of the heavy-call API in process (the broker is the real Redis, db 14; no worker runs)."""
from tests.integration.workers.conftest import (  # noqa: F401  (shared fixtures)
    api_as, broker, configure, lanes_redis, start_worker, tiny_source,
)
