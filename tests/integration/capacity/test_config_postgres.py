"""PostgreSQL-only behaviour of the config store: the bounded read and the advisory lock on saves.

Run with PostgreSQL as Django's database:
    HEAVY_LANES_TEST_ON_POSTGRES=1 .venv/bin/python -m pytest -m postgres tests/integration/capacity
A second psycopg connection plays the other process (a migration holding the table, another staff save).
"""
import logging
import threading
import time

import psycopg
import pytest
from django.db import connection

from capacity.config import get_config, get_defaults, save_config
from capacity.constants import ADVISORY_LOCK_ID
from capacity.models import CapacityConfig
from tests.conftest import missing_service

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def other_connection():
    """A second connection to the test database, as another process would have."""
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    params = connection.settings_dict
    other = psycopg.connect(
        dbname=params['NAME'], user=params['USER'], password=params['PASSWORD'] or None,
        host=params['HOST'] or None, port=params['PORT'] or None)
    yield other
    other.close()


def test_a_locked_config_table_costs_a_call_at_most_the_read_timeout(settings, other_connection, caplog):
    settings.CAPACITY_CONFIG_READ_TIMEOUT_MS = 200
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 0
    save_config({'mode': 'off'})
    # Held until rollback, as a migration would hold it; every read of the table waits for it.
    other_connection.execute('LOCK TABLE capacity_configs IN ACCESS EXCLUSIVE MODE')

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger='heavy_lanes'):
        config = get_config()
    elapsed = time.monotonic() - started

    assert config.to_json() == get_defaults()
    assert elapsed < 2
    [warning] = caplog.records
    assert warning.getMessage().startswith('Capacity config could not be read (')
    assert 'statement timeout' in warning.getMessage()

    other_connection.rollback()
    assert get_config().mode == 'off'


def test_the_read_timeout_ends_with_the_config_read(settings):
    settings.CAPACITY_CONFIG_READ_TIMEOUT_MS = 200
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 0
    get_config()
    with connection.cursor() as cursor:
        cursor.execute('SHOW statement_timeout')
        assert cursor.fetchone()[0] == '0'


def test_saves_wait_for_each_other_so_no_change_is_lost(other_connection):
    other_connection.autocommit = True
    other_connection.execute('SELECT pg_advisory_lock(%s)', [ADVISORY_LOCK_ID])
    errors = []

    def save(changes):
        try:
            save_config(changes)
        except Exception as ex:  # noqa: BLE001 - reported by the assertion below
            errors.append(ex)
        finally:
            connection.close()  # this thread's own connection; an open one would block dropping the test db

    saves = [threading.Thread(target=save, args=(changes,))
             for changes in ({'tiers': {'preview': 1}}, {'es2_knn': 2})]
    for thread in saves:
        thread.start()
    time.sleep(0.5)
    assert all(thread.is_alive() for thread in saves)  # both wait for the lock
    assert CapacityConfig.objects.count() == 0

    other_connection.execute('SELECT pg_advisory_unlock(%s)', [ADVISORY_LOCK_ID])
    for thread in saves:
        thread.join(timeout=10)

    assert errors == []
    first, second = CapacityConfig.objects.order_by('id')
    assert second.previous_config == first.config  # the second merged onto the first, not onto the defaults
    assert second.config['tiers']['preview'] == 1
    assert second.config['es2_knn'] == 2
