"""The client against a live server: the workers' fixtures (the real broker and lanes, the tiny terminology)."""
from tests.integration.workers.conftest import broker, configure, lanes_redis, tiny_source  # noqa: F401
