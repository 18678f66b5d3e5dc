"""The processes `make run` starts, as Child objects: the API, a worker per lane queue, Celery beat and the
maintenance worker that runs what it sends, Flower, and the one-shot steps (the database, the match
indexes). Each is ready when it answers as a user would see it."""
import base64
import os
import secrets
import sys

from devstack.files import read_private, write_private
from devstack.processes import Child, http_get, tail
from workers.lanes import MAINTENANCE_QUEUE, QUEUE_NAMES  # the queue table: pure Python, no Django


def api(port, logs):
    """gunicorn api.wsgi on 127.0.0.1:`port` with the API's gunicorn settings (api/gunicorn_config.py:
    API_WORKERS gthread processes of API_THREADS threads; a request waiting for a result holds a thread)."""
    url = f'http://127.0.0.1:{port}'
    return Child('api', [
        sys.executable, '-m', 'gunicorn', '-c', 'python:api.gunicorn_config', 'api.wsgi:application',
        '--bind', f'127.0.0.1:{port}', '--graceful-timeout', '5',
    ], logs / 'api.log', ready=lambda: http_get(f'{url}/healthz')[0] == 200)


def lane_worker(queue, logs):
    """The Celery worker of one lane queue, started with one pool process (its reconciler sizes the pool)."""
    log_path = logs / f'worker-{queue}.log'
    return Child(f'worker-{queue}', [
        sys.executable, '-m', 'celery', '-A', 'workers', 'worker', '-Q', queue, '-n', f'{queue}@%h',
        '-P', 'prefork', '-c', '1', '--without-gossip', '--without-mingle', '-l', 'INFO',
    ], log_path, ready=lambda: ' ready.' in tail(log_path, 200))


def lane_workers(logs):
    return [lane_worker(queue, logs) for queue in QUEUE_NAMES]


def beat(logs, var):
    """Celery beat: sends the sweep and retention (workers/celery.py's schedule) to the maintenance queue."""
    log_path = logs / 'beat.log'
    return Child('beat', [
        sys.executable, '-m', 'celery', '-A', 'workers', 'beat', '-l', 'INFO',
        '--schedule', str(var / 'celerybeat-schedule'),
    ], log_path, ready=lambda: 'beat: Starting...' in tail(log_path, 200))


def maintenance_worker(logs):
    """The worker of the maintenance queue: one process (solo), no lane, no pool to size."""
    log_path = logs / 'worker-maintenance.log'
    return Child('worker-maintenance', [
        sys.executable, '-m', 'celery', '-A', 'workers', 'worker', '-Q', MAINTENANCE_QUEUE,
        '-n', f'{MAINTENANCE_QUEUE}@%h', '-P', 'solo', '--without-gossip', '--without-mingle', '-l', 'INFO',
    ], log_path, ready=lambda: ' ready.' in tail(log_path, 200))


# Flower never turns the workers' task events on (api.settings CELERY_WORKER_SEND_TASK_EVENTS says why).
FLOWER_OPTIONS = ('--enable_events=False',)


def flower_argv(port, address='127.0.0.1'):
    """The command line of Flower on `address`:`port`, with the options every Flower of the house takes."""
    return [sys.executable, '-m', 'celery', '-A', 'workers', 'flower', f'--port={port}', f'--address={address}',
            *FLOWER_OPTIONS]


def flower(port, logs, auth):
    """Flower on 127.0.0.1:`port` behind basic auth; `auth` is 'user:password'."""
    url = f'http://127.0.0.1:{port}'
    # Flower reads FLOWER_BASIC_AUTH as --basic_auth; in the environment the password stays out of `ps`.
    flower_auth = os.environ.get('FLOWER_BASIC_AUTH') or auth
    return Child('flower', flower_argv(port), logs / 'flower.log', env={'FLOWER_BASIC_AUTH': flower_auth},
        ready=lambda: http_get(f'{url}/api/workers', {'Authorization': basic_header(auth)})[0] == 200)


def basic_header(auth):
    return 'Basic ' + base64.b64encode(auth.encode()).decode()


def flower_credentials(var):
    """'user:password' for Flower: FLOWER_BASIC_AUTH when set, else generated once into `var`."""
    if os.environ.get('FLOWER_BASIC_AUTH'):
        return os.environ['FLOWER_BASIC_AUTH'].split(',')[0]
    path = var / 'flower-credentials.json'
    saved = read_private(path)
    if not (saved and saved.get('username') and saved.get('password')):
        saved = {'username': 'admin', 'password': secrets.token_urlsafe(18)}
        write_private(path, saved)
    return f'{saved["username"]}:{saved["password"]}'


def prepare_step(logs):
    """The database steps (devstack.prepare.prepare) in a child of their own."""
    return Child('setup', [sys.executable, '-m', 'devstack', '--prepare'], logs / 'setup.log')


def index_step(logs):
    """The semantic indexes (devstack.prepare.build_indexes), built after the banner; the lane workers start
    once it ended."""
    return Child('indexes', [sys.executable, '-m', 'devstack', '--build-indexes'], logs / 'indexes.log',
                 one_shot=True)
