"""Settings and processes that would be unsafe in production refuse to start."""
import json
import os
import subprocess
import sys

from workers.celery import flower_auth_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SAFE = {'HEAVY_LANES_PRODUCTION': 'true', 'SECRET_KEY': 'a-real-secret', 'ALLOWED_HOSTS': 'api.example',
        'DATABASE_URL': 'postgres://postgres@127.0.0.1:5432/test', 'DEBUG': '', 'CORS_ALLOW_ALL_ORIGINS': '',
        'METRICS_TOKEN': 'a-scrape-token'}


def check(**env):
    environ = {k: v for k, v in os.environ.items() if k not in SAFE and k != 'DJANGO_SETTINGS_MODULE'}
    return subprocess.run([sys.executable, 'manage.py', 'check'], cwd=ROOT, capture_output=True, text=True,
                          env={**environ, 'DJANGO_SETTINGS_MODULE': 'api.settings', **SAFE, **env}, timeout=60)


def test_production_settings_with_everything_set_start():
    result = check()
    assert result.returncode == 0, result.stderr


def test_production_refuses_debug_a_missing_secret_open_hosts_and_sqlite():
    result = check(DEBUG='true', SECRET_KEY='', ALLOWED_HOSTS='*', DATABASE_URL='', CORS_ALLOW_ALL_ORIGINS='1')
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    for problem in ('DEBUG is on', 'SECRET_KEY is not set', 'ALLOWED_HOSTS must name the hosts',
                    'CORS_ALLOW_ALL_ORIGINS is on', 'embedded SQLite'):
        assert problem in message


def test_production_refuses_open_metrics():
    assert 'METRICS_TOKEN is not set' in check(METRICS_TOKEN='').stderr


def test_production_refuses_an_open_flower_api():
    assert 'FLOWER_UNAUTHENTICATED_API' in check(FLOWER_UNAUTHENTICATED_API='true').stderr


def test_flower_needs_authentication_in_production_only():
    argv = ['celery', '-A', 'workers', 'flower']
    assert 'FLOWER_BASIC_AUTH' in flower_auth_problem(argv, {}, production=True)
    assert flower_auth_problem(argv, {'FLOWER_BASIC_AUTH': 'ops:pw'}, production=True) is None
    assert flower_auth_problem([*argv, '--basic_auth=ops:pw'], {}, production=True) is None
    assert flower_auth_problem(argv, {}, production=False) is None
    assert flower_auth_problem(['celery', '-A', 'workers', 'worker'], {}, production=True) is None


def test_celery_accepts_json_only():
    from workers.celery import app
    assert app.conf.accept_content == ['json']
    assert app.conf.task_serializer == app.conf.result_serializer == 'json'
    assert app.conf.event_serializer == 'json'


def redis_url_seen(var_dir, **env):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith('REDIS_')
               and k not in ('DJANGO_SETTINGS_MODULE', 'HEAVY_LANES_PRODUCTION', 'CELERY_BROKER_URL',
                             'CACHE_REDIS_URL')}
    script = 'from django.conf import settings; print(settings.REDIS_URL, settings.CELERY_BROKER_URL)'
    result = subprocess.run(
        [sys.executable, '-c', f'import django; django.setup(); {script}'], cwd=ROOT, capture_output=True,
        text=True, timeout=60,
        env={**environ, 'DJANGO_SETTINGS_MODULE': 'api.settings', 'HEAVY_LANES_VAR_DIR': str(var_dir), **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_manage_py_beside_make_run_reaches_its_redis(tmp_path):
    """A command run beside `make run` (no REDIS_URL) talks to the Redis that run started, while it lives."""
    stack = 'redis://127.0.0.1:41999/0'
    run = tmp_path / 'run.json'
    run.write_text(json.dumps({'launcher': os.getpid(), 'redis_url': stack, 'children': {}}))
    assert redis_url_seen(tmp_path) == [stack, stack]
    assert redis_url_seen(tmp_path, REDIS_URL='redis://10.0.0.9:6379/2')[0] == 'redis://10.0.0.9:6379/2'
    assert redis_url_seen(tmp_path, REDIS_PORT='6390')[0] == 'redis://127.0.0.1:6390/0'

    gone = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True,
                          text=True, check=True)
    run.write_text(json.dumps({'launcher': int(gone.stdout), 'redis_url': stack, 'children': {}}))
    assert redis_url_seen(tmp_path)[0] == 'redis://127.0.0.1:6379/0'
    run.unlink()
    assert redis_url_seen(tmp_path)[0] == 'redis://127.0.0.1:6379/0'
