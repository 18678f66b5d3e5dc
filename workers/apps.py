from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = 'workers'
    verbose_name = 'Heavy Lanes workers'

    def ready(self):
        # Every Django process (API, management commands) publishes through the configured Celery app:
        # without this an API process would use Celery's default app, with none of our broker options.
        import workers.celery  # noqa: F401
