from django.apps import AppConfig


class WorkersApp(AppConfig):
    name = 'workers'
    verbose_name = 'Heavy Lanes workers'

    def ready(self):
        # Every Django process (API, management commands) publishes through the configured Celery app:
        # without this an API process would use Celery's default app, with none of our broker options.
        import workers.celery  # noqa: F401
        from capacity import status
        from workers.status import get_indexes, get_queues
        status.add_section('queues', get_queues)
        status.add_section('indexes', get_indexes)
        self.connect_sources()

    @staticmethod
    def connect_sources():
        """A saved or deleted Source drops the source versions every process keeps (workers.sharing)."""
        from django.db.models.signals import post_delete, post_save

        from concepts.models import Source
        from workers.local_cache import SOURCE, changed

        def source_changed(sender, using=None, **kwargs):
            changed(SOURCE, using=using)
        for signal in (post_save, post_delete):
            signal.connect(source_changed, sender=Source, weak=False,
                           dispatch_uid=f'heavy-lanes-source-{signal is post_save}')
