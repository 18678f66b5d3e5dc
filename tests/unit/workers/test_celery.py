"""Every Django process publishes through the configured Celery app, not Celery's default one."""
import subprocess
import sys

from tests.unit.api.test_settings import ROOT

PROBE = """
import django
django.setup()
from workers.tasks import run_heavy_call
app = run_heavy_call.app
print(app.main, app.conf.task_publish_retry_policy['max_retries'], app.conf.accept_content,
      app.conf.broker_transport_options['visibility_timeout'])
"""


def test_a_plain_django_process_publishes_through_the_configured_app():
    # A fresh process, as gunicorn starts one: nothing but django.setup() has run.
    result = subprocess.run([sys.executable, '-c', PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={'PATH': '/usr/bin:/bin', 'DJANGO_SETTINGS_MODULE': 'api.settings',
                                 'HEAVY_LANES_VAR_DIR': '/tmp/heavy-lanes-probe'})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['heavy_lanes', '1', "['json']", '3600']


def test_beat_sends_the_sweep_and_retention_to_the_maintenance_queue_and_nothing_else(tmp_path):
    from celery.beat import PersistentScheduler

    from workers.celery import MAINTENANCE_QUEUE, app
    from workers.lanes import QUEUE_NAMES
    # The scheduler `celery beat` runs, with the default entries it adds.
    scheduler = PersistentScheduler(app, schedule_filename=str(tmp_path / 'schedule'), lazy=True)
    scheduler.setup_schedule()
    entries = {name: (entry.task, entry.options.get('queue')) for name, entry in scheduler.schedule.items()}
    # No `celery.backend_cleanup`: the result backend never deletes a result whose call is still kept.
    assert entries == {'sweep': ('heavy_lanes.sweep', 'maintenance'),
                       'retention': ('heavy_lanes.retention', 'maintenance')}
    assert MAINTENANCE_QUEUE not in QUEUE_NAMES
    scheduler.close()


def test_a_pool_process_builds_its_result_backend_when_it_starts():
    from workers import signals
    from workers.celery import app
    app._local.__dict__.pop('backend', None)
    signals.make_result_backend()
    assert 'backend' in app._local.__dict__


def test_a_result_backend_that_cant_be_built_at_start_is_left_to_the_first_call(monkeypatch, caplog):
    import logging

    from celery import Celery

    from workers import signals

    def broken(self):
        raise ImportError('no module named django_celery_results')
    monkeypatch.setattr(Celery, 'backend', property(broken))
    with caplog.at_level(logging.WARNING, logger='heavy_lanes'):
        signals.make_result_backend()
    assert 'could not build its result backend yet: no module named django_celery_results' in caplog.text
