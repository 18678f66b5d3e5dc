"""A small real stack for fault tests: a private redis-server (the lanes, db 0, and the broker, db 1, as in
production), gunicorn serving the API, and real prefork lane workers, all started by this test and
stopped by their process groups. The test talks to it over HTTP with real tokens and injects real faults
(SIGSTOP/SIGCONT of Redis, SIGKILL of processes).
"""
import os
import sys
import time

import redis
import requests
from django.db import connection

from capacity.keys import RATE_LANE
from devstack.processes import Child, free_port
from tests.integration.workers.conftest import ROOT, wait_until
from workers import messages
from workers.lanes import QUEUE_NAMES


class FaultStack:
    def __init__(self, redis_server, key_prefix, tmp_path, start_worker):
        self.redis_server = redis_server
        self.key_prefix = key_prefix
        self.tmp_path = tmp_path
        self.start_worker = start_worker
        self.lanes_url = f'redis://127.0.0.1:{redis_server.port}/0'
        self.broker_url = f'redis://127.0.0.1:{redis_server.port}/1'
        self.apis = []
        self.children = []  # other processes of the stack's own (beat)
        self.common = {}  # settings (environment variables) for every process started from now on
        self.env = {
            **os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings',
            'HEAVY_LANES_WORKER_DB': str(connection.settings_dict['NAME']),
            'CAPACITY_KEY_PREFIX': key_prefix, 'REDIS_URL': self.lanes_url, 'CELERY_BROKER_URL': self.broker_url,
            'CAPACITY_CONFIG_CACHE_SECONDS': '1', 'WORKERS_RECONCILE_SECONDS': '0.5',
            # As in production (tests/settings.py turns the probe off for the in-process tests).
            'CAPACITY_REDIS_PROBE_SECONDS': '0.5',
        }

    # --- processes

    def api(self, host='api-a', threads=8, **env):
        """Start one gunicorn (one process, `threads` threads) as API host `host`; return its URL."""
        port = free_port()
        child = Child(f'gunicorn-{host}', [
            sys.executable, '-m', 'gunicorn', '-c', 'python:api.gunicorn_config', 'api.wsgi',
            '--bind', f'127.0.0.1:{port}', '--workers', '1', '--threads', str(threads)],
            self.tmp_path / f'gunicorn-{host}.log', cwd=ROOT).start(
            {**self.env, 'CAPACITY_TASK_ID': host, 'API_THREADS': str(threads),
             **{k: str(v) for k, v in {**self.common, **env}.items()}})
        self.apis.append(child)
        url = f'http://127.0.0.1:{port}'

        def up():
            try:
                return requests.get(url + '/healthz', timeout=1).status_code == 200
            except requests.RequestException:
                return False
        wait_until(up, timeout=30, interval=0.2, message=f'gunicorn {host} to answer')
        return url

    def worker(self, name='lanes', queues=('interactive', 'es2_knn', 'api_heavy'), concurrency=1, **env):
        return self.start_worker(name=name, queues=queues, concurrency=concurrency,
                                 REDIS_URL=self.lanes_url, CELERY_BROKER_URL=self.broker_url,
                                 **{**self.common, **env})

    def maintenance(self, sweep_seconds=1, grace_seconds=2):
        """Celery beat and the maintenance worker it sends the sweep to, as `make run` starts them, with a
        sweep every `sweep_seconds` that sends again a queued call without a message after `grace_seconds`."""
        timing = {'WORKERS_SWEEP_SECONDS': sweep_seconds, 'WORKERS_SWEEP_GRACE_SECONDS': grace_seconds}
        worker = self.worker(name='maintenance', queues=('maintenance',), **timing)
        log_path = self.tmp_path / 'beat.log'
        beat = Child('beat', [sys.executable, '-m', 'celery', '-A', 'workers', 'beat', '-l', 'INFO',
                              '--schedule', str(self.tmp_path / 'celerybeat-schedule')], log_path, cwd=ROOT)
        env = {k: str(v) for k, v in {**self.common, **timing}.items()}
        self.children.append(beat.start({**self.env, **env}))
        wait_until(lambda: 'Sending due task sweep' in beat.output(), timeout=30, interval=0.2,
                   message=f'beat to send the sweep:\n{beat.output()[-2000:]}')
        return worker

    def stop(self):
        for child in [*self.apis, *self.children]:
            child.kill()

    # --- looking at it

    def lanes(self):
        return redis.Redis.from_url(self.lanes_url, socket_timeout=5)

    def broker(self):
        return redis.Redis.from_url(self.broker_url, socket_timeout=5)

    def messages(self, queues=QUEUE_NAMES):
        """The call ids with a message on this stack's broker (waiting, or taken and not acknowledged)."""
        client = self.broker()
        try:
            return messages.present(queues, client)
        finally:
            client.close()

    def leases(self):
        """Unexpired leases in every lane of this test's prefix."""
        client = self.lanes()
        try:
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros // 1000
            return sum(client.zcount(key, f'({now_ms}', '+inf') for key in self._lane_keys(client))
        finally:
            client.close()

    def lease_members(self):
        """Every lease in every lane of this test's prefix, expired or not, and the count of leases the
        acquire script found expired without a release (`stats:expired`)."""
        client = self.lanes()
        try:
            members = {key.decode(): client.zrange(key, 0, -1, withscores=True) for key in self._lane_keys(client)}
            expired = int(client.get('{' + self.key_prefix + '}:stats:expired') or 0)
            return {key: value for key, value in members.items() if value}, expired
        finally:
            client.close()

    def _lane_keys(self, client):
        """The lease lanes of this test's prefix: its sorted sets but the rate limit's windows (requests, not
        leases: capacity.keys.rate_key)."""
        rate = '{' + self.key_prefix + '}:' + RATE_LANE + ':'
        return [key for key in client.scan_iter(match='{' + self.key_prefix + '}:*', count=1000)
                if not key.decode().startswith(rate) and client.type(key) == b'zset']

    def status(self):
        """/capacity/status/ as this stack's Redis and the workers' pool registry have it (read in-process)."""
        from django.test import override_settings

        from capacity.config import get_current
        from capacity.status import get_status
        with override_settings(REDIS_URL=self.lanes_url, REDIS_HOST='127.0.0.1', REDIS_PORT=self.redis_server.port,
                               REDIS_DB=0, CELERY_BROKER_URL=self.broker_url):
            from common import connections
            connections.forget()
            try:
                return get_status(get_current()[1])
            finally:
                connections.forget()

    def pause_redis(self, seconds):
        self.redis_server.pause()
        try:
            time.sleep(seconds)
        finally:
            self.redis_server.resume()
