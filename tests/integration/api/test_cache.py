"""The Redis cache shares one redis-py client per connection pool instead of building one per operation."""
import uuid

import pytest
from django.conf import settings

from api.cache import RedisCache

pytestmark = pytest.mark.redis


def test_operations_share_one_client_per_pool():
    cache = RedisCache(settings.REDIS_URL, {'KEY_PREFIX': f'hltest-cache-{uuid.uuid4().hex[:8]}'})
    inner = cache._cache
    first = inner.get_client('a', write=True)
    assert inner.get_client('b', write=False) is first
    try:
        cache.set('history', [1.5, 2.5], 30)
        assert cache.get('history') == [1.5, 2.5]
        assert inner.get_client('c') is first
    finally:
        cache.delete('history')
