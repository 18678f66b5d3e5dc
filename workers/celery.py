"""The Celery app: configured from Django settings (CELERY_*), one queue per queue-backed lane.

Start a worker for a lane with `celery -A workers worker -Q <queue> -n <queue>@%h -P prefork`; its pool is
then sized from the capacity config by workers.pool (prefork only: the threads pool can't be resized).
"""
import os

import django
from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
django.setup()

from workers.lanes import LANES  # noqa: E402

app = Celery('heavy_lanes')
app.config_from_object('django.conf:settings', namespace='CELERY')
# Each lane's queue has its own exchange and routing key, so nothing published by key reaches another lane.
app.conf.task_queues = [Queue(name, Exchange(name), routing_key=name) for name in LANES]
app.conf.task_default_queue = next(iter(LANES))
app.conf.task_create_missing_queues = False

import workers.tasks  # noqa: E402,F401  (registers the tasks and the worker signal handlers)
import workers.pool  # noqa: E402,F401
