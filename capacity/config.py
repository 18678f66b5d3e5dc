"""The capacity config: one JSON document checked against DEFAULTS, stored as versions, cached per process.

`validate`, `merge`, `diff` and `resolve` are pure and work on the JSON form. `get_current()` reads the
version in force from the database; `get_config()` is the request path's read. Both give the typed, frozen
view of it (capacity.defaults.Config: `config.api_heavy.cluster`; an unknown name raises). `get_config()` is
cached for CAPACITY_CONFIG_CACHE_SECONDS, bounded by CAPACITY_CONFIG_READ_TIMEOUT_MS on PostgreSQL, and it
never raises. A config it can't read never refuses
a call: it falls back to the last known config (or the defaults) with `enforce` turned into `shadow`.
`save_config()` is the one way to change the config; each change is a new CapacityConfig row and one
`ocl_capacity_config` log line.

Errors: an invalid config raises django.core.exceptions.ValidationError whose `messages` list every
problem found.
"""
import copy
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction

from capacity.constants import (
    ADVISORY_LOCK_ID, CHOICES, CONFIG_LOG_EVENT, ENFORCE, MAX_NUMBER, MODES, SHADOW, SOURCE_API, WAIT_CAP_SECONDS,
)
from capacity.defaults import DEFAULTS, Config
from capacity.logs import emit
from capacity.models import CapacityConfig
from common.database import locked_with_connection
from common.process import PerProcess

logger = logging.getLogger('heavy_lanes')

MIN_LEASE_SECONDS = 15
MAX_HISTORY = 500


def get_defaults():
    """A fresh copy of DEFAULTS, with the boot mode from settings.CAPACITY_LIMIT_MODE when it is valid."""
    defaults = copy.deepcopy(DEFAULTS)
    if settings.CAPACITY_LIMIT_MODE in MODES:
        defaults['mode'] = settings.CAPACITY_LIMIT_MODE
    return defaults


def validate(config):
    """Return `config` if it is valid, else raise ValidationError listing every error found.

    The cross-field rules run only on a config of the right shape, since they read its numbers.
    """
    errors = []
    _check_shape(config, DEFAULTS, '', errors)
    if not errors:
        errors = _check_rules(config)
    if errors:
        raise ValidationError(errors)
    return config


def _join(path, key):
    return f'{path}.{key}' if path else str(key)


def _check_shape(value, template, path, errors):
    if not isinstance(value, dict):
        errors.append(f'{path or "config"} must be an object.')
        return
    errors.extend(f'Unknown setting "{_join(path, key)}".' for key in value if key not in template)
    for key, expected in template.items():
        child = _join(path, key)
        if key not in value:
            errors.append(f'"{child}" is required.')
        elif isinstance(expected, dict):
            _check_shape(value[key], expected, child, errors)
        elif child in CHOICES:
            if value[key] not in CHOICES[child]:
                errors.append(f'"{child}" must be one of {", ".join(CHOICES[child])}.')
        elif not _is_number(value[key]):
            errors.append(f'"{child}" must be a whole number from 0 to {MAX_NUMBER}.')


def _is_number(value):
    # bool is an int subclass, and True in a config is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_NUMBER


def _check_rules(config):
    errors = []
    lease = config['lease_seconds']
    if config['reserve_single_row'] > config['api_heavy']['cluster']:
        errors.append('"reserve_single_row" can\'t be more than "api_heavy.cluster".')
    if lease < MIN_LEASE_SECONDS:
        errors.append(f'"lease_seconds" must be at least {MIN_LEASE_SECONDS}.')
    if not 1 <= config['renew_seconds'] <= lease // 3:
        # A third leaves room for two failed renewals before the lease runs out.
        errors.append('"renew_seconds" must be at least 1 and at most a third of "lease_seconds".')
    if config['max_hold_seconds'] < lease:
        errors.append('"max_hold_seconds" can\'t be less than "lease_seconds".')
    retry_after = config['retry_after']
    if (retry_after['base'] < 1 or retry_after['paused'] < 1 or retry_after['min'] < 1
            or retry_after['max'] < max(retry_after['base'], retry_after['min'])):
        errors.append('"retry_after" needs "base", "min" and "paused" of at least 1, and "max" of at least '
                      '"base" and "min".')
    if retry_after['measured'] not in (0, 1):
        errors.append('"retry_after.measured" must be 1 (from measured hold times) or 0 (the base alone).')
    if config['queue']['deadline_seconds'] < lease:
        errors.append('"queue.deadline_seconds" can\'t be less than "lease_seconds".')
    wait = config['wait']
    if wait['max_seconds'] > WAIT_CAP_SECONDS:
        errors.append(f'"wait.max_seconds" can\'t be more than {WAIT_CAP_SECONDS}.')
    if wait['default_seconds'] > wait['max_seconds']:
        errors.append('"wait.default_seconds" can\'t be more than "wait.max_seconds".')
    return errors


@dataclass(frozen=True)
class TimeLimits:
    """How long one call may run, in whole seconds (Celery's per-message soft and hard time limits)."""

    soft: int  # SoftTimeLimitExceeded is raised in the task: it releases its leases and ends `failed`
    hard: int  # the pool process is killed; the worker's main process ends the call `failed`


def time_limits(config):
    """The time limits of a call run under `config`: soft at `max_hold_seconds` (when its leases stop
    being renewed), hard `renew_seconds` later.

    The leases were last renewed at most `renew_seconds` before the soft limit and last `lease_seconds`
    (at least 3 x `renew_seconds`), so they are still held when the hard limit strikes: a call is never
    counted out while it still runs.
    """
    soft = config.max_hold_seconds
    return TimeLimits(soft=soft, hard=soft + config.renew_seconds)


def broker_problems(config, visibility_timeout):
    """Why `config` can't run on a broker whose unacknowledged messages come back after
    `visibility_timeout` s (CELERY_VISIBILITY_TIMEOUT): a message may stay unacknowledged for its queue
    deadline plus the hard time limit, and one that came back sooner would run the call twice."""
    longest = config.queue.deadline_seconds + time_limits(config).hard
    if longest < visibility_timeout:
        return []
    return [f'"queue.deadline_seconds" + "max_hold_seconds" + "renew_seconds" ({longest} s) must stay '
            f'under the broker\'s visibility timeout (CELERY_VISIBILITY_TIMEOUT, {visibility_timeout} s).']


def merge(base, changes, known_only=False):
    """A deep copy of `base` with `changes` merged in dict by dict; `known_only` drops keys `base` lacks."""
    merged = copy.deepcopy(base)
    for key, value in (changes or {}).items():
        if known_only and key not in merged:
            continue
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value, known_only)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def diff(old, new):
    """`{dotted.path: [old, new]}` for every leaf that differs; a missing side (or a None dict) is None."""
    return _diff(old, new, '')


def _diff(old, new, path):
    old, new = old or {}, new or {}
    changes = {}
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        child = _join(path, key)
        if _is_branch(before, after):
            changes.update(_diff(before, after, child))
        elif before != after:
            changes[child] = [before, after]
    return changes


def _is_branch(before, after):
    """Both sides are dicts, or one is and the other is missing: compare them key by key."""
    sides = (before, after)
    return any(isinstance(side, dict) for side in sides) and all(
        isinstance(side, dict) or side is None for side in sides)


def nest(path, value):
    """`nest('tiers.preview', 1) == {'tiers': {'preview': 1}}`: a dotted setting as nested dicts."""
    for key in reversed(path.split('.')):
        value = {key: value}
    return value


def resolve(stored):
    """The config a stored document puts in force: the defaults plus its known keys, or the defaults.

    Keys a stored row has but DEFAULTS no longer has (retired settings) are dropped silently. An invalid
    result is logged as an error and the defaults apply instead.
    """
    defaults = get_defaults()
    # A stored document that isn't an object can't be merged; validate() reports it.
    config = merge(defaults, stored, known_only=True) if isinstance(stored, (dict, type(None))) else stored
    try:
        return validate(config)
    except ValidationError as ex:
        logger.error('Capacity config is invalid (%s); using the defaults', '; '.join(ex.messages))
        return defaults


def get_current():
    """`(latest CapacityConfig row or None, the config in force)`, read from the database, not the cache."""
    row = CapacityConfig.get_latest()
    return row, Config.from_json(resolve(row.config if row else None))


def read_current():
    """get_current(), bounded by CAPACITY_CONFIG_READ_TIMEOUT_MS on PostgreSQL outside a transaction.

    A locked table or a slow database then costs a call at most the timeout. Inside a transaction the
    timeout would outlive this read (SET LOCAL lasts until the outer commit), so it reads without one; the
    savepoint keeps a failed read from breaking the caller's transaction. Elsewhere a read outside a
    transaction opens none: SQLite begins every transaction with the write lock (transaction_mode
    IMMEDIATE), and this read runs under the cache lock, so it would wait for another thread's write
    transaction while that thread waits for the cache lock (a submission's does): a deadlock until the
    busy timeout.
    """
    bounded = connection.vendor == 'postgresql' and not connection.in_atomic_block
    if not bounded and not connection.in_atomic_block:
        return get_current()
    with transaction.atomic():
        if bounded:
            with connection.cursor() as cursor:
                cursor.execute(f'SET LOCAL statement_timeout = {int(settings.CAPACITY_CONFIG_READ_TIMEOUT_MS)}')
        return get_current()


# (config, expires_at on the monotonic clock), replaced as a whole so the fast path reads it without the lock.
_cache = (None, 0.0)
# A lane worker forks pool processes while its reconciler thread may hold the lock: a child gets a new one.
_cache_lock = PerProcess(threading.Lock)


def get_config():
    """The config in force, cached per process for CAPACITY_CONFIG_CACHE_SECONDS. Never raises.

    The same frozen Config is shared by every caller until the cache expires.
    """
    global _cache
    started = time.monotonic()
    config, expires_at = _cache
    if config is not None and started < expires_at:
        return config
    with locked_with_connection(_cache_lock.get()):  # a connection first: see common.database
        config, expires_at = _cache
        if config is not None and started < expires_at:  # another thread refreshed it while we waited
            return config
        try:
            config = read_current()[1]
        except Exception as ex:  # noqa: BLE001 - the one place a config read fails open
            logger.warning('Capacity config could not be read (%s: %s); using the last known config',
                           type(ex).__name__, ex)
            config = config if config is not None else Config.from_json(get_defaults())
            if config.mode == ENFORCE:
                # Never refuse a call on a config we couldn't confirm.
                config = dataclasses.replace(config, mode=SHADOW)
        # The fallback is cached too, so a database outage costs one read per process per interval.
        _cache = (config, started + settings.CAPACITY_CONFIG_CACHE_SECONDS)
        return config


def clear_cache():
    """Make the next get_config() read the database."""
    global _cache
    _cache = (None, 0.0)


class Superseded(Exception):
    """A change made against a version that is no longer the newest (save_config's `based_on`)."""


ANY_VERSION = object()


def save_config(changes, user=None, source=SOURCE_API, note='', replace=False, based_on=ANY_VERSION):
    """Merge `changes` into the config in force (or into the defaults with `replace`) and save a version.

    Returns `(row, config, changed)`: `config` is the Config now in force, `changed` is
    `{dotted.path: [old, new]}`. When nothing changes, no row is added, nothing is logged, and `row` is the
    latest row (or None). Raises ValidationError when the result is invalid; unknown keys in `changes` are
    rejected, not dropped. With `based_on` (a version id, None for no version yet) the change is saved only
    if that version is still the newest, else Superseded is raised: a change computed from what a version
    said (a hand resize's new total) is never merged onto a newer one.
    """
    with transaction.atomic():
        if connection.vendor == 'postgresql':
            # Serializes changes, so a PATCH never merges onto a version another save is replacing.
            with connection.cursor() as cursor:
                cursor.execute('SELECT pg_advisory_xact_lock(%s)', [ADVISORY_LOCK_ID])
        latest, previous = get_current()
        if based_on is not ANY_VERSION and (latest.id if latest else None) != based_on:
            raise Superseded(f'version {latest.id if latest else None} is newer than {based_on}')
        previous = previous.to_json()
        config = validate(merge(get_defaults() if replace else previous, changes))
        problems = broker_problems(Config.from_json(config), settings.CELERY_VISIBILITY_TIMEOUT)
        if problems:
            # Checked on a change only: a stored config stays in force in a process whose own setting
            # differs (resolve() reads no settings but the mode).
            raise ValidationError(problems)
        changed = diff(previous, config)
        if not changed:
            return latest, Config.from_json(previous), {}
        row = CapacityConfig.objects.create(
            config=config, previous_config=previous, created_by=user, source=source, note=note or '')
    clear_cache()
    try:
        emit({
            'event': CONFIG_LOG_EVENT,
            'version': row.id,
            'changed_by': user.username if user else None,
            'source': source,
            'note': note or None,
            'changes': changed,
            'mode': config['mode'],
        })
    except Exception as ex:  # noqa: BLE001 - the change is saved; its log line is not worth failing it
        logger.warning('Capacity config version %s was saved, but its log line failed: %s', row.id, ex)
    return row, Config.from_json(config), changed


def version_data(row):
    """Who made version `row`, when, how and why; every value None when there is no row."""
    if row is None:
        return dict.fromkeys(('version', 'created_by', 'created_at', 'source', 'note'))
    return {
        'version': row.id,
        'created_by': row.created_by.username if row.created_by else None,
        'created_at': row.created_at,
        'source': row.source,
        'note': row.note or None,
    }


def get_history(limit):
    """The newest `limit` versions (1 to MAX_HISTORY), each with its changes from the version before."""
    limit = min(max(limit, 1), MAX_HISTORY)
    rows = CapacityConfig.objects.select_related('created_by').order_by('-id')[:limit]
    return [{**version_data(row), 'changes': diff(row.previous_config, row.config)} for row in rows]
