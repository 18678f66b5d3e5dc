"""An API process imports what its first requests would, before gunicorn gives it one (api.wsgi.warm), and
leaves what it loaded out of the garbage collector's scans."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = '''
import gc, json, sys
import django
django.setup()
frozen_before = gc.get_freeze_count()
before = {name: name in sys.modules for name in ('concepts.services', 'drf_spectacular.views', 'api.urls')}
from api import wsgi
from django.urls import get_resolver
after = {name: name in sys.modules for name in before}
print(json.dumps({'before': before, 'after': after, 'resolved': 'url_patterns' in get_resolver().__dict__,
                  'app': callable(wsgi.application), 'frozen_before': frozen_before,
                  'frozen': gc.get_freeze_count(), 'left': len(gc.get_objects())}))
'''


def test_loading_the_wsgi_application_imports_the_views_and_the_matching_service():
    env = {**os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings'}
    out = subprocess.run([sys.executable, '-c', PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(seen['before'].values())  # nothing imported them before the application loaded
    assert all(seen['after'].values()) and seen['resolved'] and seen['app']
    # Everything loaded by then is frozen: a full collection no longer walks it (api.wsgi's docstring).
    assert seen['frozen_before'] == 0 and seen['frozen'] > 50_000 and seen['left'] < seen['frozen'] / 10
