"""The Celery app: configured from Django settings (CELERY_*), one Celery queue per row of workers.lanes.

Start a worker for a queue with `celery -A workers worker -Q <queue> -n <queue>@%h -P prefork`; its pool
is then sized from the capacity config by workers.pool (prefork only: the threads pool can't be resized).

Every Django process loads this module (WorkersConfig.ready) so the API publishes with the configured
broker options. It defines the app and nothing else: the task and the workers' signal handlers are in
`include`, which only a worker process imports (Celery's loader does, at worker start), so an API process
never registers a worker's signal handler. The API publishes by task name (TASK_NAME).
"""
import os
import sys

import django
from celery import Celery
from celery.signals import setup_logging
from django.apps import apps
from django.conf import settings
from kombu import Exchange, Queue

from common import jsonlog

os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
# One BLAS thread per pool process: the pool already has a process per core it may use, and a thread per
# core in each of them made two processes slower than one (docs/benchmarks.md). Set before numpy loads.
for _name in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
    os.environ.setdefault(_name, '1')
if not apps.ready and not apps.loading:
    django.setup()  # a Celery command imports this first; in Django processes WorkersConfig.ready() does

from workers.lanes import MAINTENANCE_QUEUE, QUEUE_NAMES  # noqa: E402

TASK_NAME = 'heavy_lanes.run_heavy_call'
# A call's first message carries its worker leases in this header (capacity.admission.lease_from_message).
LEASES_HEADER = 'heavy_lanes_leases'
SWEEP_TASK = 'heavy_lanes.sweep'
RETENTION_TASK = 'heavy_lanes.retention'

app = Celery('heavy_lanes', include=['workers.tasks', 'workers.signals'])
app.config_from_object('django.conf:settings', namespace='CELERY')
# The anonymous exchange with the queue's name as routing key: the Redis transport then pushes a message
# straight onto that queue's list. A named exchange would route through bindings kept in Redis, and a
# message published while they are missing (a fresh or flushed Redis, before any worker declared them)
# would be dropped: an admitted call must never vanish.
ANON = Exchange('', type='direct')
app.conf.task_queues = [Queue(name, ANON, routing_key=name) for name in (*QUEUE_NAMES, MAINTENANCE_QUEUE)]
app.conf.task_default_queue = QUEUE_NAMES[0]
app.conf.task_create_missing_queues = False
# Celery beat (`celery -A workers beat`) sends these; each expires after one interval, so a maintenance
# worker that was down doesn't run a backlog of them. The result backend's own daily cleanup is off
# (CELERY_RESULT_EXPIRES = None): results are deleted only with their calls (workers.retention).
app.conf.beat_schedule = {
    'sweep': {'task': SWEEP_TASK, 'schedule': settings.WORKERS_SWEEP_SECONDS,
              'options': {'queue': MAINTENANCE_QUEUE, 'expires': settings.WORKERS_SWEEP_SECONDS}},
    'retention': {'task': RETENTION_TASK, 'schedule': settings.HEAVY_LANES_RETENTION_RUN_SECONDS,
                  'options': {'queue': MAINTENANCE_QUEUE,
                              'expires': settings.HEAVY_LANES_RETENTION_RUN_SECONDS}},
}
# Celery's Django fixup closes the database connection around every task unless told to reuse it; a new
# PostgreSQL connection per call cost about 8 ms of a 4 ms call (docs/benchmarks.md).
app.conf['CELERY_DB_REUSE_MAX'] = settings.CELERY_DB_REUSE_MAX


def flower_auth_problem(argv, environ, production):
    """Why Flower must not start, or None: in production it needs basic auth or OAuth."""
    if not production or 'flower' not in argv:
        return None
    if environ.get('FLOWER_BASIC_AUTH') or environ.get('FLOWER_AUTH') or any(
            arg.startswith(('--basic_auth', '--basic-auth', '--auth')) for arg in argv):
        return None
    return ('Refusing to start Flower with HEAVY_LANES_PRODUCTION=true and no authentication: set '
            'FLOWER_BASIC_AUTH=user:password (or --auth for OAuth).')


_problem = flower_auth_problem(sys.argv, os.environ, settings.PRODUCTION)
if _problem:
    raise SystemExit(_problem)
if 'flower' in sys.argv:
    from workers.flower import protect_metrics
    protect_metrics()


# Workers and beat log like every other process (settings.LOGGING: JSON lines with the request id). A
# receiver of `setup_logging` stops Celery from setting up logging itself; an API process never sends it.
setup_logging.connect(jsonlog.setup_celery_logging, weak=False)
