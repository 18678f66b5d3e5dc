"""bench/ and the test fixtures import devstack outside Django, and the launcher process never sets Django
up: importing any devstack module (but the embedded server) loads neither Django nor a Redis client."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULES = ('devstack', 'devstack.__main__', 'devstack.banner', 'devstack.files', 'devstack.launcher',
           'devstack.prepare', 'devstack.processes', 'devstack.redis_server', 'devstack.services')
HEAVY = ('django', 'rest_framework', 'celery', 'kombu', 'redis', 'fakeredis')


def test_importing_devstack_loads_neither_django_nor_a_redis_client():
    probe = (f'import importlib, sys\n'
             f'for name in {MODULES!r}: importlib.import_module(name)\n'
             f'print(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))')
    result = subprocess.run([sys.executable, '-c', probe], cwd=ROOT, env={'PATH': '/usr/bin:/bin'},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[]'
