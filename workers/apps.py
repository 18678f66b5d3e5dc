from django.apps import AppConfig


class WorkersApp(AppConfig):
    name = 'workers'
    verbose_name = 'Heavy Lanes workers'

    def ready(self):
        # Every Django process (API, management commands) publishes through the configured Celery app:
        # without this an API process would use Celery's default app, with none of our broker options.
        import workers.celery  # noqa: F401
        from capacity import status
        from workers.status import get_queues
        status.add_section('queues', get_queues)
