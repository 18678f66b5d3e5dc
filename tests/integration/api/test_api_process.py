"""An API process serves /metrics and /capacity/status/ without loading any of the workers' Celery code:
not the task module, and no worker signal handler (they would run in every API process otherwise)."""
import json
import os
import subprocess
import sys

import pytest
from django.db import connection

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CHILD = '''
import json, sys, weakref
import django
django.setup()
from django.test import Client
from celery import signals
client = Client(HTTP_HOST='127.0.0.1')  # outside the test runner 'testserver' is no allowed host
metrics = client.get('/metrics')
status = client.get('/capacity/status/', HTTP_AUTHORIZATION='Token ' + sys.argv[1])
handlers = sorted({
    f'{getattr(receiver, "__module__", "?")}.{getattr(receiver, "__name__", "?")}'
    for name in dir(signals) if isinstance(getattr(signals, name), signals.Signal)
    for receiver in (getattr(signals, name).receivers or [])
    for receiver in [receiver[1]() if isinstance(receiver[1], weakref.ReferenceType) else receiver[1]]
    if receiver is not None and getattr(receiver, '__module__', '').startswith('workers')})
print(json.dumps({'metrics': metrics.status_code, 'status': status.status_code, 'handlers': handlers,
                  'modules': sorted(m for m in sys.modules if m in ('workers.tasks', 'workers.signals'))}))
'''


@pytest.mark.slow
def test_metrics_and_status_load_no_worker_signal_handler(transactional_db, make_user):
    staff = make_user(is_staff=True)
    env = {**os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings',
           'HEAVY_LANES_WORKER_DB': str(connection.settings_dict['NAME'])}
    done = subprocess.run([sys.executable, '-c', CHILD, staff.auth_token.key], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report['metrics'], report['status']) == (200, 200), report
    assert report['handlers'] == [] and report['modules'] == [], report
