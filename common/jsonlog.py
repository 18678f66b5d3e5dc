"""One JSON log format for every process: Django, gunicorn and Celery write one JSON object a line, with
the request id of what they were doing (common.request_id).

    {"time": "2026-12-01T11:30:36.120Z", "level": "INFO", "logger": "heavy_lanes", "message": "...",
     "process": 4242, "request_id": "9f1c...", "task_id": "ab12..."}

`JsonFormatter` is python-json-logger's, with these fields; `ContextFilter` adds `request_id` (and the
Celery task id, in a worker running a task) to every record. Django uses both through settings.LOGGING,
Celery workers and beat through the same dict (workers.celery connects `setup_logging`), gunicorn through
api.gunicorn_logging.JsonLogger (`--logger-class`). The per-call `ocl_capacity` lines (capacity.logs) are
already JSON and written as they are, with the request id among their fields. No Django import at module
level.
"""
import logging
import logging.config
import sys

from pythonjsonlogger.json import JsonFormatter as BaseJsonFormatter

from common import request_id

FIELDS = ('time', 'level', 'logger', 'message', 'process', 'request_id', 'task_id')
RENAMED = {'asctime': 'time', 'levelname': 'level', 'name': 'logger'}


class JsonFormatter(BaseJsonFormatter):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault('fmt', '%(asctime)s %(levelname)s %(name)s %(message)s %(process)d')
        kwargs.setdefault('rename_fields', RENAMED)
        kwargs.setdefault('timestamp', False)
        super().__init__(*args, **kwargs)

    def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's name
        import time
        return time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(record.created)) + f'.{int(record.msecs):03d}Z'

    def add_fields(self, log_record, record, message_dict):
        super().add_fields(log_record, record, message_dict)
        for name in ('request_id', 'task_id'):
            if log_record.get(name) is None:
                log_record.pop(name, None)


def current_task_id():
    """The id of the Celery task this process runs now, if Celery is loaded and runs one."""
    state = sys.modules.get('celery._state')
    task = state.get_current_task() if state is not None else None
    return getattr(getattr(task, 'request', None), 'id', None)


class ContextFilter(logging.Filter):
    """Add the bound request id (and the running Celery task's id) to each record that lacks them."""

    def filter(self, record):
        if getattr(record, 'request_id', None) is None:
            record.request_id = request_id.get()
        if getattr(record, 'task_id', None) is None:
            record.task_id = current_task_id()
        return True


def config(level='INFO'):
    """The logging dict (logging.config.dictConfig) every process uses: JSON lines on stderr."""
    return {
        'version': 1,
        'disable_existing_loggers': False,
        'filters': {'context': {'()': 'common.jsonlog.ContextFilter'}},
        'formatters': {'json': {'()': 'common.jsonlog.JsonFormatter'}},
        'handlers': {'console': {'class': 'logging.StreamHandler', 'formatter': 'json',
                                 'filters': ['context']}},
        'root': {'handlers': ['console'], 'level': 'WARNING'},
        'loggers': {
            'heavy_lanes': {'level': level},
            'django': {'level': 'INFO'},
            'celery': {'level': 'INFO'},
            'flower': {'level': 'INFO'},
        },
    }


def setup_celery_logging(loglevel=None, **kwargs):
    """Celery's `setup_logging` receiver (workers.celery connects it): settings.LOGGING instead of
    Celery's own format; `-l` still sets the level of Celery's loggers."""
    from django.conf import settings
    logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger('celery').setLevel(loglevel)
