"""The config cache beside a pool of database connections, as the API runs on PostgreSQL (DATABASE_POOL_SIZE).

A thread that must refresh the config takes its connection before the cache's lock (common.database
.locked_with_connection). Taken the other way round, a refresher that held the lock and waited for a
connection, while a request thread held the pool's last one and waited for the lock, stopped both for the
pool's timeout, and the refresher fell back to the last known config: seen under a bulk flood as every
request of one API process stalled for 20 s and one answered 503.

    HEAVY_LANES_TEST_ON_POSTGRES=1 .venv/bin/python -m pytest -m postgres tests/integration/capacity/test_config_pool.py
"""
import threading
import time

import pytest
from django.db import connection

from capacity.config import clear_cache, get_config, save_config
from tests.conftest import missing_service

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
POOL_TIMEOUT_SECONDS = 2.0


@pytest.fixture
def pool_of_one():
    """Django's own pool over psycopg_pool for this test's database, one connection, as the API sets it up
    (api.settings.database) but smaller; yields the pool."""
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    connection.close()
    options, max_age = connection.settings_dict['OPTIONS'], connection.settings_dict['CONN_MAX_AGE']
    connection.settings_dict['OPTIONS'] = {**options, 'pool': {'min_size': 1, 'max_size': 1,
                                                               'timeout': POOL_TIMEOUT_SECONDS}}
    connection.settings_dict['CONN_MAX_AGE'] = 0
    try:
        yield connection.pool
    finally:
        connection.close()
        connection.close_pool()
        connection.settings_dict['OPTIONS'], connection.settings_dict['CONN_MAX_AGE'] = options, max_age


def waiting_for_a_connection(pool):
    return pool.get_stats().get('requests_waiting', 0) > 0


def test_a_refresh_never_waits_for_a_connection_while_it_holds_the_cache_lock(pool_of_one, settings, caplog):
    save_config({'es2_knn': 7})
    connection.close()  # the pool's one connection back
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 60
    clear_cache()
    holding, go, seen = threading.Event(), threading.Event(), {}

    def request_thread():
        """Holds the pool's one connection, as a request that has run a query does, then needs the config."""
        try:
            connection.ensure_connection()
            holding.set()
            go.wait(10)
            seen['request'] = get_config()
        finally:
            connection.close()

    def refresher():
        """Finds the cache expired and no connection of its own."""
        try:
            seen['refresher'] = get_config()
        finally:
            connection.close()

    threads = [threading.Thread(target=request_thread), threading.Thread(target=refresher)]
    threads[0].start()
    assert holding.wait(10)
    started = time.monotonic()
    threads[1].start()
    deadline = started + 10
    while not waiting_for_a_connection(pool_of_one) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiting_for_a_connection(pool_of_one)  # the refresher waits for the one connection ...
    go.set()  # ... and now the request thread needs the config
    for thread in threads:
        thread.join(10)
    # Neither waited out the pool's timeout, and both have the config in force, not a fallback.
    assert time.monotonic() - started < POOL_TIMEOUT_SECONDS
    assert seen['request'].es2_knn == seen['refresher'].es2_knn == 7
    assert 'could not be read' not in caplog.text
