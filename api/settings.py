"""Django settings for Heavy Lanes.

Every value comes from the environment with an embedded default that runs on one machine: SQLite in
``var/`` and a Redis at 127.0.0.1:6379, or the one the ``make run`` running on ``var/`` started. Production
sets ``DATABASE_URL`` (PostgreSQL), ``REDIS_URL`` or the ``REDIS_*`` parts, and
``HEAVY_LANES_PRODUCTION=true``.
"""
import json
import os
import socket
from pathlib import Path
from urllib.parse import unquote, urlparse

import dj_database_url
from whitenoise.compress import Compressor

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get('HEAVY_LANES_VAR_DIR', BASE_DIR / 'var'))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name, default=False):
    value = os.environ.get(name)
    if value is None or value == '':
        return default
    return value.strip().lower() in ('1', 'true', 'yes', 'on')


def env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value not in (None, '') else default


def env_float(name, default):
    value = os.environ.get(name)
    return float(value) if value not in (None, '') else default


def env_list(name, default=''):
    return [item.strip() for item in os.environ.get(name, default).split(',') if item.strip()]


PRODUCTION = env_bool('HEAVY_LANES_PRODUCTION')
# Off unless asked for, also under `make run`: errors are the API's JSON (api.errors), never Django's debug pages
# (a 249 KB HTML page with the settings and the stack, to any client).
DEBUG = env_bool('DEBUG')
SECRET_KEY = os.environ.get('SECRET_KEY') or ('' if PRODUCTION else 'dev-only-not-secret-heavy-lanes')
# The Host header names this service in the links it makes (a page's `next`, from the request's host): outside
# production only the loopback names `make run` listens on are served, as Django itself allows with DEBUG on,
# so a forged Host is a 400, never a link to another site. Production names its hosts (production_problems).
LOOPBACK_HOSTS = '.localhost,127.0.0.1,[::1]'
ALLOWED_HOSTS = env_list('ALLOWED_HOSTS', '' if PRODUCTION else LOOPBACK_HOSTS)

INSTALLED_APPS = [
    'django.contrib.admin',
    'django.contrib.auth',
    'django.contrib.contenttypes',
    'django.contrib.sessions',
    'django.contrib.messages',
    'django.contrib.staticfiles',
    'corsheaders',
    'rest_framework',
    'rest_framework.authtoken',
    'drf_spectacular',
    'drf_spectacular_sidecar',  # Swagger UI's files for /schema/docs/, served from here: no CDN
    'django_celery_results',
    'capacity',
    'workers',
    'concepts',
    'api',
]

MIDDLEWARE = [
    'api.middleware.RequestId',
    'api.middleware.RequestSizeLimit',
    'corsheaders.middleware.CorsMiddleware',
    'django.middleware.security.SecurityMiddleware',
    # Static files (the admin's, the lanes page's, Swagger UI's) from STATIC_ROOT, before anything else reads
    # the request: no separate web server needed, under `make run` as in production.
    'whitenoise.middleware.WhiteNoiseMiddleware',
    'django.contrib.sessions.middleware.SessionMiddleware',
    'django.middleware.common.CommonMiddleware',
    'django.middleware.csrf.CsrfViewMiddleware',
    'django.contrib.auth.middleware.AuthenticationMiddleware',
    'django.contrib.messages.middleware.MessageMiddleware',
]

# Bodies larger than this get 413 before anything parses them (1000 rows of 1000 characters fit).
MAX_REQUEST_BYTES = env_int('MAX_REQUEST_BYTES', 2 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES
# And answers: a body whose answer could hold more candidates (rows x limit) or bytes than these is a 400 before
# it is admitted (concepts.bounds, docs/api.md "Answer bounds").
MAX_MATCH_CANDIDATES = env_int('MAX_MATCH_CANDIDATES', 10_000)
MAX_ANSWER_BYTES = env_int('MAX_ANSWER_BYTES', 32 * 1024 * 1024)
# The part of a $match answer that echoes the body's map_config and filter in every row (rows x their size).
MAX_ECHO_BYTES = env_int('MAX_ECHO_BYTES', 4 * 1024 * 1024)
# A stored answer longer than this is read from the database and sent in slices of it (api.renderers). Each
# slice is one query whose cost grows with its offset (PostgreSQL finds a character offset in a compressed
# text by decompressing up to it): 4 MiB reads a 32 MB answer in 8 (bench/answer_memory.py, docs/benchmarks.md).
RESULT_SLICE_CHARACTERS = env_int('RESULT_SLICE_CHARACTERS', 4 * 1024 * 1024)

ROOT_URLCONF = 'api.urls'
WSGI_APPLICATION = 'api.wsgi.application'

TEMPLATES = [{
    'BACKEND': 'django.template.backends.django.DjangoTemplates',
    'DIRS': [],
    'APP_DIRS': True,
    'OPTIONS': {'context_processors': [
        'django.template.context_processors.request',
        'django.contrib.auth.context_processors.auth',
        'django.contrib.messages.context_processors.messages',
    ]},
}]

DATABASE_POOL_SIZE = env_int('DATABASE_POOL_SIZE', 0)


def database(url):
    """The settings of the database at `url`, as every process of the service (and the tests) uses it."""
    settings = dj_database_url.parse(
        url, conn_max_age=env_int('DATABASE_CONN_MAX_AGE', 0),
        # A kept or pooled connection is checked before it is used again (the pool's check, Django's own
        # for a persistent one): one a database restart or failover ended costs a round trip, not a request.
        conn_health_checks=True)
    if settings['ENGINE'] == 'django.db.backends.sqlite3':
        # API and worker processes write the same file. Wait for the lock instead of failing at once, and
        # take it when a transaction begins: a reader that later wants to write gets "database is locked"
        # at once, without waiting, when another process writes. (Not WAL: pool processes forked from a
        # worker that has the file open hung on their first query.)
        settings.setdefault('OPTIONS', {}).update({'timeout': 20, 'transaction_mode': 'IMMEDIATE'})
    elif DATABASE_POOL_SIZE and settings['ENGINE'] == 'django.db.backends.postgresql':
        # A connection pool per API process (Django's own, over psycopg_pool) when DATABASE_POOL_SIZE is set,
        # as api/gunicorn_config.py sets it for the API: 2 processes of 64 threads would otherwise keep a
        # connection per thread (CONN_MAX_AGE) or open one per request, and dozens of requests waiting for
        # their results would hold PostgreSQL's connections (100 by default) for nothing. A thread borrows a
        # connection for a request and gives it back at the end, and a waiting request gives it back while
        # it waits (workers.lifecycle.wait). Not in the workers: a prefork child must not inherit its
        # parent's pool.
        settings['CONN_MAX_AGE'] = 0  # the pool keeps the connections
        settings.setdefault('OPTIONS', {})['pool'] = {
            'min_size': 1, 'max_size': DATABASE_POOL_SIZE, 'timeout': env_float('DATABASE_POOL_TIMEOUT', 20.0)}
    return settings


DATABASES = {'default': database(os.environ.get('DATABASE_URL') or f'sqlite:///{VAR_DIR / "heavy_lanes.sqlite3"}')}
DEFAULT_AUTO_FIELD = 'django.db.models.BigAutoField'

LANGUAGE_CODE = 'en-us'
TIME_ZONE = 'UTC'
USE_I18N = False
USE_TZ = True
# Static files are served by the API itself (WhiteNoise, in MIDDLEWARE) from what `collectstatic` gathered into
# STATIC_ROOT: the image collects them when it is built, `make run` before it starts the API. Each file's name
# carries a hash of its content (so it is cached for a year) and a gzip copy sits beside it. With DEBUG on they
# are served from the apps' folders as they are.
STATIC_URL = 'static/'
STATIC_ROOT = Path(os.environ.get('STATIC_ROOT') or VAR_DIR / 'static')
STORAGES = {
    'default': {'BACKEND': 'django.core.files.storage.FileSystemStorage'},
    'staticfiles': {'BACKEND': 'whitenoise.storage.CompressedManifestStaticFilesStorage'},
}
# Source maps (14 of Swagger UI's and ReDoc's 24 MB) are read only by a browser's developer tools: gzipping them
# doubled collectstatic's time (about 4 s against 8-11 s on 2 cores) for no page.
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = [*Compressor.SKIP_COMPRESS_EXTENSIONS, 'map']

REST_FRAMEWORK = {
    'DEFAULT_AUTHENTICATION_CLASSES': ['api.authentication.KeptTokenAuthentication'],
    'DEFAULT_PERMISSION_CLASSES': ['rest_framework.permissions.IsAuthenticated'],
    'DEFAULT_SCHEMA_CLASS': 'drf_spectacular.openapi.AutoSchema',
    'UNAUTHENTICATED_USER': 'django.contrib.auth.models.AnonymousUser',
    'EXCEPTION_HANDLER': 'api.errors.handle',
    'DEFAULT_RENDERER_CLASSES': ['api.renderers.JSONRenderer', 'rest_framework.renderers.BrowsableAPIRenderer'],
    'DEFAULT_PARSER_CLASSES': ['api.parsers.StrictJSONParser', 'rest_framework.parsers.FormParser',
                               'rest_framework.parsers.MultiPartParser'],
    'DEFAULT_THROTTLE_RATES': {'heavy': os.environ.get('HEAVY_RATE_LIMIT', '600/min')},
}
SPECTACULAR_SETTINGS = {
    'TITLE': 'Heavy Lanes API',
    'DESCRIPTION': 'Heavy calls admitted through lease lanes and run on per-lane Celery queues.',
    'VERSION': '1.0.0',
    'POSTPROCESSING_HOOKS': ['drf_spectacular.hooks.postprocess_schema_enums', 'api.schema.restore_dollar_paths'],
    'SWAGGER_UI_DIST': 'SIDECAR', 'SWAGGER_UI_FAVICON_HREF': 'SIDECAR', 'REDOC_DIST': 'SIDECAR',
}
# Origins a browser may send a session's writes from (the admin, the lanes page) when they differ from the
# Host Django sees, e.g. https://lanes.example.org behind a proxy that terminates TLS. Comma-separated.
CSRF_TRUSTED_ORIGINS = env_list('CSRF_TRUSTED_ORIGINS')

# --- Tiers: a user's highest plan, from is_staff and these groups (highest first after staff).
CORE_USER_GROUP = os.environ.get('CORE_USER_GROUP', 'core_user')
EARLY_ACCESS_GROUP = os.environ.get('EARLY_ACCESS_GROUP', 'early_access')
PREVIEW_GROUP = os.environ.get('PREVIEW_GROUP', 'preview')


def running_stack_redis_url(var_dir):
    """The Redis of the `make run` running on `var_dir` (its run.json, while its launcher lives), or ''.

    `make run` starts its own Redis on a free port and tells only its children; a `manage.py` command run
    beside it (revoking a token, `capacity status`, draining a lane) must reach that Redis and broker, not
    the default one, or what it announces is heard by nobody.
    """
    try:
        run = json.loads((Path(var_dir) / 'run.json').read_text())
        os.kill(int(run['launcher']), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return ''
    return run.get('redis_url') or ''


# --- Redis. REDIS_URL, when set, wins over the parts; with neither, outside production, the Redis of a
# `make run` on this VAR_DIR.
REDIS_URL = os.environ.get('REDIS_URL', '')
if not REDIS_URL and not PRODUCTION and not any(
        os.environ.get(name) for name in ('REDIS_HOST', 'REDIS_PORT', 'REDIS_DB', 'REDIS_PASSWORD')):
    REDIS_URL = running_stack_redis_url(VAR_DIR)
if REDIS_URL:
    _redis = urlparse(REDIS_URL)
    REDIS_HOST = _redis.hostname or '127.0.0.1'
    REDIS_PORT = _redis.port or 6379
    REDIS_DB = int((_redis.path or '/0').lstrip('/') or 0)
    REDIS_PASSWORD = unquote(_redis.password) if _redis.password else None
else:
    REDIS_HOST = os.environ.get('REDIS_HOST', '127.0.0.1')
    REDIS_PORT = env_int('REDIS_PORT', 6379)
    REDIS_DB = env_int('REDIS_DB', 0)
    REDIS_PASSWORD = os.environ.get('REDIS_PASSWORD') or None
    REDIS_URL = 'redis://{auth}{host}:{port}/{db}'.format(
        auth=f':{REDIS_PASSWORD}@' if REDIS_PASSWORD else '', host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
REDIS_SENTINELS = env_bool('REDIS_SENTINELS')
REDIS_SENTINELS_LIST = [
    (host.rsplit(':', 1)[0], int(host.rsplit(':', 1)[1]) if ':' in host else 26379)
    for host in env_list('REDIS_SENTINELS_LIST')
]
REDIS_SENTINELS_MASTER = os.environ.get('REDIS_SENTINELS_MASTER', 'mymaster')

# Django's cache, shared by every API process, so in Redis (on the one client factory, common.connections:
# its timeouts are the `cache` role's; Sentinel is followed for the main Redis). The rate limit doesn't use it
# (api.throttles counts in the lane store).
CACHES = {'default': {
    'BACKEND': 'api.cache.RedisCache',
    'LOCATION': os.environ.get('CACHE_REDIS_URL') or REDIS_URL,
    'KEY_PREFIX': 'heavy-lanes',
}}

# --- Capacity limiter (see docs/architecture.md and capacity/).
CAPACITY_LIMIT_MODE = os.environ.get('CAPACITY_LIMIT_MODE', 'shadow')
CAPACITY_CONFIG_CACHE_SECONDS = env_int('CAPACITY_CONFIG_CACHE_SECONDS', 10)
CAPACITY_CONFIG_READ_TIMEOUT_MS = env_int('CAPACITY_CONFIG_READ_TIMEOUT_MS', 500)
CAPACITY_REDIS_TIMEOUT_SECONDS = env_float('CAPACITY_REDIS_TIMEOUT_SECONDS', 0.5)
# Must stay under lease_seconds - 2 x renew_seconds (60 - 40 = 20 with the defaults), so one Redis error
# can't make a long call miss two renewals in a row.
CAPACITY_REDIS_RETRY_SECONDS = env_int('CAPACITY_REDIS_RETRY_SECONDS', 15)
# How often a process in its skip window PINGs Redis to close the window as soon as Redis answers
# (capacity.breaker); 0 keeps the window for its whole length.
CAPACITY_REDIS_PROBE_SECONDS = env_float('CAPACITY_REDIS_PROBE_SECONDS', 0.5)
CAPACITY_REDIS_DEADLINE_SECONDS = env_float('CAPACITY_REDIS_DEADLINE_SECONDS', 1.0)
# How long a process gathers its event counters (capacity.counters) before it sends them in one job; 0 sends
# them at each increment.
CAPACITY_COUNTERS_GATHER_SECONDS = env_float('CAPACITY_COUNTERS_GATHER_SECONDS', 0.25)
CAPACITY_TASK_ID = os.environ.get('CAPACITY_TASK_ID', '') or socket.gethostname()
CAPACITY_KEY_PREFIX = os.environ.get('CAPACITY_KEY_PREFIX', 'ocl:capacity')
# The longest a process keeps a caller's token or a source's version (workers.local_cache) when a change to
# it went unannounced; an announced change drops it at once everywhere. 0 keeps nothing.
HEAVY_LANES_LOCAL_CACHE_SECONDS = env_int('HEAVY_LANES_LOCAL_CACHE_SECONDS', 30)
# The pub/sub channel those changes are announced on; one per deployment sharing a Redis.
HEAVY_LANES_INVALIDATION_CHANNEL = os.environ.get('HEAVY_LANES_INVALIDATION_CHANNEL', 'heavy-lanes:invalidate')
# Identical calls of different users share one run and one warm result (workers.sharing) only when this is
# on: a user then learns, from a `coalesced` or `cached` answer and its speed, that someone sent the same
# rows to the same source lately (docs/operations.md). Off, only one user's own identical calls share.
HEAVY_LANES_SHARE_ACROSS_USERS = env_bool('HEAVY_LANES_SHARE_ACROSS_USERS', False)

# --- The API's serving model: gunicorn's gthread workers, API_THREADS threads per process (docs/architecture.md,
# "Waiting"). A request waiting for a call's result holds a thread, not a process; at most
# API_WAITING_PER_PROCESS of a process's threads wait at once, so the rest always serve other requests. The
# host-wide bound is the config's api_heavy.per_task (64 by default). gunicorn doesn't spread connections
# evenly over its processes (bench/waiting.py saw 34 of 64 waiting requests on one of two), so each process
# may hold most of the host's waiting requests: 56 of 64 threads.
API_THREADS = env_int('API_THREADS', 64)
API_WAITING_PER_PROCESS = env_int('API_WAITING_PER_PROCESS', max(API_THREADS - 8, 1))

# Matching (concepts/): the embedder for semantic $match, the reranker, and how many loaded indexes a
# process keeps. Unset, concepts.services picks its defaults (docs/quality.md).
CONCEPTS_EMBEDDER = os.environ.get('CONCEPTS_EMBEDDER')
CONCEPTS_RERANKER = os.environ.get('CONCEPTS_RERANKER')
CONCEPTS_INDEX_CACHE_SIZE = env_int('CONCEPTS_INDEX_CACHE_SIZE', 8)
# How long an API process trusts a target_repo_url it found (the worker checks again before running).
CONCEPTS_SOURCE_CACHE_SECONDS = env_int('CONCEPTS_SOURCE_CACHE_SECONDS', 10)

# /metrics is open unless this is set (production requires it); scrapers send `Authorization: Bearer <it>`.
METRICS_TOKEN = os.environ.get('METRICS_TOKEN', '')

CORS_ALLOW_ALL_ORIGINS = env_bool('CORS_ALLOW_ALL_ORIGINS', default=not PRODUCTION)
CORS_ALLOWED_ORIGINS = env_list('CORS_ALLOWED_ORIGINS')
# What a browser client may send and read (docs/api.md, "CORS"). Each is a comma-separated list in the
# environment that replaces the default below. The default allows every request header OCL's clients send
# (the OCL Mapper sends INCLUDESEARCHLATEST and X-OCL-CLIENT on every call; a preflight that refuses one
# fails the call) and exposes the capacity, rate-limit and handle headers a client acts on.
CORS_DEFAULT_ALLOW_HEADERS = [
    'accept', 'authorization', 'content-type', 'user-agent', 'x-csrftoken', 'x-requested-with',  # the library's
    'idempotency-key', 'prefer', 'x-request-id', 'x-ocl-event-metadata', 'x-ocl-request-source', 'x-ocl-client',
    'includefacets', 'includesearchstats', 'includesearchlatest', 'x-ocl-request-idempotency-key',
    'x-ocl-prompt-template-key', 'x-ocl-prompt-template-version',
]
CORS_DEFAULT_EXPOSE_HEADERS = [
    'Retry-After', 'Location', 'Content-Location', 'Preference-Applied', 'X-Request-Id', 'num_returned',
    'X-OCL-Capacity-Decision', 'X-OCL-Capacity-Limit', 'X-OCL-Capacity-In-Flight', 'X-OCL-Capacity-Tier',
    'X-OCL-Capacity-Tier-Limit', 'X-OCL-Capacity-Tier-In-Flight', 'X-OCL-Capacity-Suggested-Concurrency',
    'RateLimit', 'RateLimit-Policy',
]
CORS_ALLOW_HEADERS = env_list('CORS_ALLOW_HEADERS') or CORS_DEFAULT_ALLOW_HEADERS
CORS_EXPOSE_HEADERS = env_list('CORS_EXPOSE_HEADERS') or CORS_DEFAULT_EXPOSE_HEADERS

# One JSON object a line on stderr for every logger, with the request id (common.jsonlog); Celery workers and
# beat use the same dict (workers.celery), gunicorn its JSON logger class (api.gunicorn_logging).
from common.jsonlog import config as _logging_config  # noqa: E402 - no Django import in it

LOGGING = _logging_config(os.environ.get('LOG_LEVEL', 'INFO'))

# --- Celery: Redis broker (a separate one may be named), results in the database, JSON only.
# With REDIS_SENTINELS and no CELERY_BROKER_URL, the broker is the main Redis found through the Sentinels
# (kombu's Sentinel transport, the master named by REDIS_SENTINELS_MASTER), like every other connection.
CELERY_BROKER_URL = os.environ.get('CELERY_BROKER_URL') or (';'.join(
    'sentinel://{auth}{host}:{port}/{db}'.format(auth=f':{REDIS_PASSWORD}@' if REDIS_PASSWORD else '', host=host,
                                                 port=port, db=REDIS_DB)
    for host, port in REDIS_SENTINELS_LIST) if REDIS_SENTINELS and REDIS_SENTINELS_LIST else REDIS_URL)
# kombu's Redis transports, with one publishing client per channel and acknowledgements that never cost a
# prefetch slot (workers/broker.py), the Sentinel one too.
if CELERY_BROKER_URL.split('://', 1)[0] in ('redis', 'rediss'):
    CELERY_BROKER_TRANSPORT = 'workers.broker:Transport'
elif CELERY_BROKER_URL.startswith('sentinel://'):
    CELERY_BROKER_TRANSPORT = 'workers.broker:SentinelTransport'
CELERY_RESULT_BACKEND = 'django-db'
CELERY_RESULT_EXTENDED = True
CELERY_TASK_SERIALIZER = 'json'
CELERY_RESULT_SERIALIZER = 'json'
CELERY_ACCEPT_CONTENT = ['json']
CELERY_EVENT_SERIALIZER = 'json'
# A call's message is acknowledged only when it finished: a worker that dies mid-call leaves it to be
# delivered again (at once when only its pool process died, after the visibility timeout when the node
# died). Prefetch 1 keeps a busy worker from hoarding calls another node could start.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# And never more reserved than the pool has processes now. The prefetch count alone drifts from the pool:
# Celery's pool_shrink skips lowering it when billiard refuses to stop a busy process, so a node shrunk
# while its calls ran kept a prefetch above its processes and held a second call behind its one process
# while another node had one free (tests/integration/workers/test_queue.py). Redis brokers only.
CELERY_WORKER_DISABLE_PREFETCH = True
# How long a new pool process may take to report that it is up before the worker kills it (Celery's default
# is 4 s). The worker's main loop reads that report, and in a Redis stall each of its broker operations can
# take the broker's socket timeout: with 4 s, processes forked during a stall were killed as hung.
CELERY_WORKER_PROC_ALIVE_TIMEOUT = env_float('CELERY_WORKER_PROC_ALIVE_TIMEOUT', 30.0)
# Must exceed the longest a message can stay unacknowledged: its queue deadline plus max_hold_seconds
# (600 + 900 s with the defaults). Shorter redelivers a dead node's calls sooner, but a call still running
# past it would be delivered twice.
CELERY_VISIBILITY_TIMEOUT = env_int('CELERY_VISIBILITY_TIMEOUT', 3600)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    'visibility_timeout': CELERY_VISIBILITY_TIMEOUT,
    'queue_order_strategy': 'priority',
    'priority_steps': [0, 3, 6, 9],
    'socket_timeout': env_float('CELERY_BROKER_SOCKET_TIMEOUT', 2.0),
    'socket_connect_timeout': env_float('CELERY_BROKER_SOCKET_TIMEOUT', 2.0),
}
if CELERY_BROKER_URL.startswith('sentinel://'):
    CELERY_BROKER_TRANSPORT_OPTIONS['master_name'] = REDIS_SENTINELS_MASTER
    if REDIS_PASSWORD:
        CELERY_BROKER_TRANSPORT_OPTIONS['sentinel_kwargs'] = {'password': REDIS_PASSWORD}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Publishing happens inside a request: fail fast (the API answers 503) instead of retrying for seconds.
CELERY_TASK_PUBLISH_RETRY_POLICY = {'max_retries': 1, 'interval_start': 0, 'interval_step': 0.2,
                                    'interval_max': 0.2}
# The most a request waits for its call's message to be published (workers.publisher): then it answers 503.
CELERY_PUBLISH_DEADLINE_SECONDS = env_float('CELERY_PUBLISH_DEADLINE_SECONDS', 2.0)
# No task events (received, started, succeeded): each was a Redis PUBLISH per call and, with the rest, about
# 1.3 ms of a lane node's main process a call, for Flower's task views alone (the lanes page, GET /tasks/ and
# /metrics show the calls). Worker events (online, heartbeats) still go: Flower's worker views and its pool
# resize use them. Flower is started with --enable_events=False everywhere (devstack.services.FLOWER_OPTIONS,
# docker-compose.yml, the cluster), or it would turn task events back on in every worker.
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_TASK_SEND_SENT_EVENT = False
CELERY_DB_REUSE_MAX = env_int('CELERY_DB_REUSE_MAX', 1000)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The per-call JSON lines go to stdout as they are (one JSON object a line), not wrapped in log records.
CELERY_WORKER_REDIRECT_STDOUTS = False
# The niceness of the pool processes of a node that serves only bulk lanes (workers.signals.yield_to_requests):
# on a host they share with the API, requests and single-row calls get a core first. 0 leaves them as started.
WORKERS_BULK_NICENESS = env_int('WORKERS_BULK_NICENESS', 10)
# How often a running call's worker beats its row (and so how soon a cancel reaches a call whose revoke was
# lost); a delivery takes over from a worker whose beat is older than lease_seconds.
WORKERS_HEARTBEAT_SECONDS = env_float('WORKERS_HEARTBEAT_SECONDS', 5.0)
# How often a lane worker re-reads the config to resize its pool (the config cache refresh).
WORKERS_RECONCILE_SECONDS = env_float('WORKERS_RECONCILE_SECONDS', CAPACITY_CONFIG_CACHE_SECONDS)
# Maintenance, sent by Celery beat to the `maintenance` queue (workers/sweep.py, workers/retention.py):
# the sweep ends calls past their deadline and publishes again the ones whose message is gone (queued
# longer than the grace period, or running with a dead worker); retention deletes calls, with their
# results, that ended longer ago than HEAVY_LANES_RETENTION_SECONDS (7 days).
WORKERS_SWEEP_SECONDS = env_float('WORKERS_SWEEP_SECONDS', 30)
WORKERS_SWEEP_GRACE_SECONDS = env_float('WORKERS_SWEEP_GRACE_SECONDS', 60)
HEAVY_LANES_RETENTION_SECONDS = env_int('HEAVY_LANES_RETENTION_SECONDS', 7 * 24 * 3600)
HEAVY_LANES_RETENTION_RUN_SECONDS = env_float('HEAVY_LANES_RETENTION_RUN_SECONDS', 3600)
# Results are deleted with their calls, never on their own (a succeeded call always has its result).
CELERY_RESULT_EXPIRES = None
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / 'celerybeat-schedule')


def production_problems():
    """What makes these settings unsafe to serve production with (HEAVY_LANES_PRODUCTION=true)."""
    problems = []
    if DEBUG:
        problems.append('DEBUG is on')
    if not SECRET_KEY or SECRET_KEY.startswith('dev-only'):
        problems.append('SECRET_KEY is not set')
    if not ALLOWED_HOSTS or '*' in ALLOWED_HOSTS:
        problems.append('ALLOWED_HOSTS must name the hosts')
    if CORS_ALLOW_ALL_ORIGINS:
        problems.append('CORS_ALLOW_ALL_ORIGINS is on')
    if not METRICS_TOKEN:
        problems.append('METRICS_TOKEN is not set (/metrics would be open to anyone)')
    if env_bool('FLOWER_UNAUTHENTICATED_API'):
        problems.append('FLOWER_UNAUTHENTICATED_API opens Flower\'s API to anyone')
    if DATABASES['default']['ENGINE'] == 'django.db.backends.sqlite3':
        problems.append('the database is the embedded SQLite (set DATABASE_URL)')
    return problems


if PRODUCTION and production_problems():
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured('Refusing to start with HEAVY_LANES_PRODUCTION=true: '
                               + '; '.join(production_problems()) + '.')

# Benchmark-only floor views under /bench/ (api/bench_views.py, used by bench/*.py): off unless set, and
# never on in production whatever the environment says.
HEAVY_LANES_BENCH_VIEWS = env_bool('HEAVY_LANES_BENCH_VIEWS') and not PRODUCTION
