"""Fixtures every integration package shares."""
import pytest

from capacity.config import clear_cache
from capacity.store import LaneStore, use_store


@pytest.fixture
def lanes(redis_client, db):
    """A LaneStore on this test's backend (fakeredis or the real Redis) with a cold config cache; yields the
    Redis client, to look at the lanes."""
    use_store(LaneStore(redis_client))
    clear_cache()
    yield redis_client
    use_store(None)
    clear_cache()
