"""Test settings: the app's settings with a private var dir and quiet logging.

The database is SQLite unless HEAVY_LANES_TEST_DATABASE_URL names a PostgreSQL; the PostgreSQL-only tests
(statement timeouts, advisory locks) connect to that URL themselves through the `postgres` fixture.
"""
import os
import tempfile

# Each process of a parallel run (pytest-xdist's workers: `make test` runs two) has its own var dir, and so
# its own SQLite test database, and its own broker prefix below. A worker inherits the controller's
# environment, so its values are made anew once per xdist worker; the processes a test starts inherit the
# worker's.
_xdist_worker = os.environ.get('PYTEST_XDIST_WORKER', '')
if os.environ.get('HEAVY_LANES_TEST_XDIST_WORKER', '') != _xdist_worker:
    os.environ['HEAVY_LANES_TEST_XDIST_WORKER'] = _xdist_worker
    os.environ.pop('HEAVY_LANES_VAR_DIR', None)
    os.environ.pop('HEAVY_LANES_TEST_RUN_ID', None)
os.environ.setdefault('HEAVY_LANES_VAR_DIR', tempfile.mkdtemp(prefix='heavy-lanes-test-'))
# Tests use their own Redis databases: 13 for lanes, notifications and pools (keys under per-test
# prefixes), 14 for the Celery broker (flushed by the worker fixtures).
os.environ.setdefault('REDIS_URL', os.environ.get('HEAVY_LANES_TEST_REDIS_URL', 'redis://127.0.0.1:6379/13'))
os.environ.setdefault('CELERY_BROKER_URL', os.environ.get('HEAVY_LANES_TEST_BROKER_URL', 'redis://127.0.0.1:6379/14'))

# The tests that need a call to last (tests/integration/workers/test_queue.py LONG_ROWS: 1000 rows x limit 100,
# 40,000 candidates of the tiny source) ask for more than the default answer bound of 10,000 candidates; the
# bound's own tests set theirs (tests/integration/api/test_bounds.py).
os.environ.setdefault('MAX_MATCH_CANDIDATES', '40000')

# Every test run (and the workers it starts) puts its broker keys under a prefix of its own, so two runs on
# one machine (a developer's and CI's) never take each other's messages.
os.environ.setdefault('HEAVY_LANES_TEST_RUN_ID', os.urandom(4).hex())

from api.settings import *  # noqa: E402,F401,F403

CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405 - from api.settings
                                   'global_keyprefix': f'hltest-{os.environ["HEAVY_LANES_TEST_RUN_ID"]}:'}
# And its announcements of changed tokens and sources on a channel of its own (workers.local_cache): another
# test process's change would drop what a test counts on being kept.
HEAVY_LANES_INVALIDATION_CHANNEL = f'heavy-lanes:invalidate:{os.environ["HEAVY_LANES_TEST_RUN_ID"]}'

if os.environ.get('HEAVY_LANES_TEST_ON_POSTGRES') == '1':
    # The second pass of `make test`: the tests marked `postgres` run with PostgreSQL as the database, set up
    # as the service sets up its own (api.settings.database).
    DATABASES = {'default': database(  # noqa: F405 - from api.settings
        os.environ.get('HEAVY_LANES_TEST_DATABASE_URL', 'postgres://postgres@127.0.0.1:5432/test'))}

CAPACITY_TASK_ID = os.environ.get('CAPACITY_TASK_ID') or 'test-host'
# A file, not memory, so worker processes started by the tests open the same test database.
DATABASES['default']['TEST'] = {'NAME': os.path.join(os.environ['HEAVY_LANES_VAR_DIR'], 'test-db.sqlite3')}
if os.environ.get('HEAVY_LANES_WORKER_DB'):
    DATABASES['default']['NAME'] = os.environ['HEAVY_LANES_WORKER_DB']
if os.environ.get('HEAVY_LANES_TEST_READ_ONLY_DB') == '1':
    # A fault: this process's database connections refuse every write, as a full or read-only disk would
    # (SQLite), or a server that only takes reads (PostgreSQL: a hot standby, a read-only role).
    if DATABASES['default']['ENGINE'] == 'django.db.backends.sqlite3':
        DATABASES['default'].setdefault('OPTIONS', {})['init_command'] = 'PRAGMA query_only = ON'
    else:
        DATABASES['default'].setdefault('OPTIONS', {})['options'] = '-c default_transaction_read_only=on'

# No probe closes a test's skip window behind its back (a test opens it on a Redis that answers): the probe's
# own tests and the fault stacks' processes set it (capacity.breaker).
CAPACITY_REDIS_PROBE_SECONDS = float(os.environ.get('CAPACITY_REDIS_PROBE_SECONDS', '0'))
# A test's counters reach its own keys as it makes them, not a moment later under the next test's prefix and
# store: sent at each increment (capacity.counters; its own test sets a gathering time).
CAPACITY_COUNTERS_GATHER_SECONDS = float(os.environ.get('CAPACITY_COUNTERS_GATHER_SECONDS', '0'))

# The static files' plain names, from the apps' folders: the live server of the browser tests serves them itself
# (pytest-django's, as Django's runserver does), and nothing here runs collectstatic. The hashed, compressed files
# the service serves through WhiteNoise are tested on the stack `make run` starts
# (tests/acceptance/test_make_run_pages.py).
STORAGES = {**STORAGES, 'staticfiles': {  # noqa: F405 - from api.settings
    'BACKEND': 'django.contrib.staticfiles.storage.StaticFilesStorage'}}
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405 - WhiteNoise warns about a STATIC_ROOT that isn't there

CACHES = {'default': {'BACKEND': 'django.core.cache.backends.locmem.LocMemCache'}}
PASSWORD_HASHERS = ['django.contrib.auth.hashers.MD5PasswordHasher']
