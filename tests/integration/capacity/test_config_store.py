"""Config versions in the database: saving, history, the log line, the per-process cache and its fallback."""
import logging

import pytest
from django.core.exceptions import ValidationError
from django.db import OperationalError

from capacity import config as capacity_config
from capacity.config import clear_cache, get_config, get_current, get_defaults, merge, save_config
from capacity.models import CapacityConfig

pytestmark = pytest.mark.django_db


def test_save_config_adds_a_version_with_its_history(make_user, config_lines):
    staff = make_user(username='ada', is_staff=True)
    assert get_config().mode == 'shadow'  # cached before the change

    row, config, changed = save_config({'mode': 'off', 'tiers': {'preview': 1}}, user=staff, note='quiet night')

    assert changed == {'mode': ['shadow', 'off'], 'tiers.preview': [2, 1]}
    assert config.to_json() == merge(get_defaults(), {'mode': 'off', 'tiers': {'preview': 1}})
    row.refresh_from_db()
    assert row.config == config.to_json()
    assert row.previous_config == get_defaults()
    assert (row.created_by, row.source, row.note) == (staff, 'api', 'quiet night')
    assert CapacityConfig.get_latest() == row
    assert get_current() == (row, config)
    assert get_config() == config
    assert config_lines == [{
        'event': 'ocl_capacity_config', 'version': row.id, 'changed_by': 'ada', 'source': 'api',
        'note': 'quiet night', 'changes': changed, 'mode': 'off',
    }]

    second, config2, changed2 = save_config({'es2_knn': 2}, source='command')
    assert changed2 == {'es2_knn': [3, 2]}
    assert config2.tiers.preview == 1 and config2.mode == 'off'  # the earlier change stays
    assert second.previous_config == config.to_json()
    assert (second.created_by, second.source, second.note) == (None, 'command', '')
    assert config_lines[-1]['changed_by'] is None and config_lines[-1]['note'] is None

    same, config3, changed3 = save_config({'es2_knn': 2})
    assert (same, config3, changed3) == (second, config2, {})
    assert CapacityConfig.objects.count() == 2
    assert len(config_lines) == 2


def test_save_config_replace_starts_from_the_defaults():
    save_config({'mode': 'off', 'tiers': {'preview': 1}, 'es2_knn': 1})

    row, config, changed = save_config({'es2_knn': 2}, replace=True)

    assert config.to_json() == merge(get_defaults(), {'es2_knn': 2})
    assert changed == {'es2_knn': [1, 2], 'mode': ['off', 'shadow'], 'tiers.preview': [1, 2]}


def test_a_failed_log_line_doesnt_fail_a_saved_change(monkeypatch, caplog):
    def broken_emit(record):
        raise BrokenPipeError('stdout is gone')
    monkeypatch.setattr('capacity.config.emit', broken_emit)

    with caplog.at_level(logging.WARNING, logger='heavy_lanes'):
        row, config, changed = save_config({'mode': 'off'})

    assert CapacityConfig.get_latest() == row
    assert [r.getMessage() for r in caplog.records] == [
        f'Capacity config version {row.id} was saved, but its log line failed: stdout is gone']


@pytest.mark.parametrize('changes, message', [
    ({'es2_knn': -1}, '"es2_knn" must be a whole number from 0 to 100000.'),
    ({'bogus': 1}, 'Unknown setting "bogus".'),
    ({'wait': {'max_seconds': 3601}}, '"wait.max_seconds" can\'t be more than 3600.'),
])
def test_save_config_rejects_an_invalid_change(config_lines, changes, message):
    with pytest.raises(ValidationError) as caught:
        save_config(changes)
    assert caught.value.messages == [message]
    assert CapacityConfig.objects.count() == 0
    assert config_lines == []


def test_a_stored_version_with_retired_settings_still_applies_its_known_ones():
    CapacityConfig.objects.create(
        config={**get_defaults(), 'es2_knn': 1, 'retired_setting': 5}, source='api')
    assert get_current()[1].to_json() == merge(get_defaults(), {'es2_knn': 1})


def test_get_config_is_cached(settings):
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 60
    assert get_config().mode == 'shadow'
    CapacityConfig.objects.create(config=merge(get_defaults(), {'mode': 'off'}), source='command')

    assert get_config().mode == 'shadow'
    clear_cache()
    assert get_config().mode == 'off'


def test_an_expired_cache_reads_the_database_again(settings):
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 0
    assert get_config().mode == 'shadow'
    CapacityConfig.objects.create(config=merge(get_defaults(), {'mode': 'off'}), source='command')
    assert get_config().mode == 'off'


def failing_reads(monkeypatch):
    """Make every config read fail like a database that went away; return the list of attempts."""
    attempts = []

    def read_current():
        attempts.append(1)
        raise OperationalError('server closed the connection unexpectedly')
    monkeypatch.setattr(capacity_config, 'read_current', read_current)
    return attempts


def test_get_config_keeps_the_last_known_config_when_the_database_fails(settings, monkeypatch, caplog):
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 0
    with monkeypatch.context() as broken, caplog.at_level(logging.WARNING, logger='heavy_lanes'):
        failing_reads(broken)
        assert get_config().to_json() == get_defaults()
    assert [r.getMessage() for r in caplog.records] == [
        'Capacity config could not be read (OperationalError: server closed the connection unexpectedly); '
        'using the last known config']

    save_config({'mode': 'enforce', 'enforce_for': 'all', 'tiers': {'preview': 1}})
    enforced = get_config()
    assert enforced.mode == 'enforce'

    with monkeypatch.context() as broken:
        failing_reads(broken)
        fallback = get_config()
    # The numbers stay, but a config nobody could confirm never refuses a call.
    assert fallback.to_json() == {**enforced.to_json(), 'mode': 'shadow'}
    assert enforced.mode == 'enforce'  # the fallback is a copy; callers holding the old one are unaffected

    assert get_config().mode == 'enforce'  # the database is back


def test_a_failed_read_is_cached_so_an_outage_costs_one_read_per_interval(settings, monkeypatch):
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 60
    attempts = failing_reads(monkeypatch)
    for _ in range(5):
        assert get_config().to_json() == get_defaults()
    assert len(attempts) == 1


@pytest.mark.django_db(transaction=True)
def test_a_config_read_never_waits_for_another_connections_write_transaction(make_user):
    """The config is read under the process's cache lock. A read that waited for another thread's write
    transaction (SQLite's BEGIN IMMEDIATE takes the write lock) deadlocked with a thread whose transaction
    needs the config, as a submission's does: every thread of the process then stood still for the
    database's busy timeout (20 s), and other processes' writes failed with "database is locked"."""
    import threading
    import time

    from django.db import connection, transaction

    save_config({'es2_knn': 7})
    user = make_user()
    written, done = threading.Event(), threading.Event()

    def writer():
        try:
            with transaction.atomic():
                user.first_name = 'writing'
                user.save()
                written.set()
                done.wait(30)
        finally:
            connection.close()
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert written.wait(10)
        clear_cache()
        started = time.monotonic()
        config = get_config()
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join(30)
    assert config.es2_knn == 7  # read from the database, not the fallback
    assert took < 2
