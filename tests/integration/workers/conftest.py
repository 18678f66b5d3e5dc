"""Real Celery worker processes against the real Redis, for the queue tests.

Each test gets workers of its own (`start_worker`), stopped by process group at teardown even when the test
fails. They share the test database file (tests run with transaction=True so rows are committed), use Redis
db 14 as the broker (flushed around each test) and this test's key prefix for pool registration.
"""
import os
import signal
import sys
import time
import uuid

import pytest
import redis
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from capacity.config import clear_cache, save_config
from capacity.store import LaneStore, use_store
from devstack.processes import Child
from tests.conftest import delete_prefixed, real_redis_client
from workers.lanes import QUEUE_NAMES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Worker:
    """A lane worker node of the test's own: a Child (devstack.processes), the leader of its process group."""

    STOP_SECONDS = 15

    def __init__(self, name, queues, concurrency, env, log_dir):
        self.name = name
        self.node = f'{name}@heavy-lanes-test'
        self.queues = queues
        self.concurrency = concurrency
        self.env = env
        self.child = Child(name, [
            sys.executable, '-m', 'celery', '-A', 'workers', 'worker', '-Q', ','.join(self.queues),
            '-n', self.node, '-c', str(self.concurrency), '-P', 'prefork', '--without-mingle',
            '--without-gossip', '-l', 'INFO',
        ], os.path.join(log_dir, f'{name}-{uuid.uuid4().hex[:6]}.log'), cwd=ROOT)

    @property
    def process(self):
        return self.child.process

    def start(self):
        self.child.start(self.env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.child.running():
                raise AssertionError(f'worker {self.node} exited:\n{self.output()}')
            if 'ready.' in self.output():
                return self
            time.sleep(0.1)
        raise AssertionError(f'worker {self.node} did not start:\n{self.output()}')

    def output(self):
        return self.child.output()

    def kill(self, sig=signal.SIGKILL):
        """Signal the whole node: its main process and every pool process."""
        if self.child.running():
            self.child.signal_group(sig)

    def stop(self):
        """SIGTERM to the node's group, SIGKILL after STOP_SECONDS, then any pool process left behind."""
        if self.process is not None:
            self.child.stop(self.STOP_SECONDS)


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        client.ping()
    except redis.RedisError as ex:
        from tests.conftest import missing_service
        missing_service(f'no broker Redis at {settings.CELERY_BROKER_URL}: {ex}')
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix']

    def clean():
        # Only this run's keys: another test run may share the broker database.
        for key in client.scan_iter(match=prefix + '*', count=1000):
            client.delete(key)
    clean()
    yield client
    clean()
    client.close()


@pytest.fixture
def lanes_redis(key_prefix, transactional_db):
    """The real Redis as the lane store for this process and the workers (keys under the test prefix)."""
    client = real_redis_client()
    use_store(LaneStore(client))
    clear_cache()
    yield client
    use_store(None)
    clear_cache()
    delete_prefixed(client, key_prefix)
    client.close()


@pytest.fixture
def start_worker(broker, lanes_redis, key_prefix, tmp_path):
    started = []

    def start(name='lanes', queues=QUEUE_NAMES, concurrency=1, **env):
        worker_env = {
            **os.environ,
            'DJANGO_SETTINGS_MODULE': 'tests.settings',
            'HEAVY_LANES_WORKER_DB': str(connection.settings_dict['NAME']),
            'CAPACITY_KEY_PREFIX': key_prefix,
            'CAPACITY_CONFIG_CACHE_SECONDS': '1',
            'WORKERS_RECONCILE_SECONDS': '0.5',
            **{key: str(value) for key, value in env.items()},
        }
        worker = Worker(name, list(queues), concurrency, worker_env, tmp_path)
        started.append(worker)
        return worker.start()
    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def configure():
    def configure(**changes):
        from unittest import mock
        with mock.patch('capacity.config.emit'):
            save_config(changes)
    return configure


@pytest.fixture
def tiny_source(transactional_db):
    from concepts.loader import load_terminology
    from concepts.terminology import read_tiny
    load_terminology(read_tiny())
    return '/orgs/HL/sources/TinyClinical/'


@pytest.fixture
def api_as(make_user):
    def api_as(user):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f'Token {user.auth_token.key}')
        return client
    return api_as


def wait_until(predicate, timeout=20, interval=0.05, message='condition'):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f'timed out after {timeout} s waiting for {message}')


# Celery's own in-process worker (celery.contrib.pytest, installed with pytest-celery): a thread of this
# test process running the service's app with the solo pool, started and stopped around each test that
# asks for `in_process_worker`. Enough for a test that only needs its calls to run; a test that kills a
# process, terminates a running call, needs a pool sized by the reconciler or a paused queue uses real
# prefork workers (`start_worker`). It is function-scoped: a worker left running would take the messages
# of the next test's real workers.
@pytest.fixture
def celery_app():
    from workers.celery import app
    return app


@pytest.fixture
def celery_worker_parameters():
    from workers.lanes import QUEUE_NAMES
    return {'queues': list(QUEUE_NAMES), 'perform_ping_check': False}


@pytest.fixture
def in_process_worker(broker, lanes_redis, celery_worker):
    return celery_worker
