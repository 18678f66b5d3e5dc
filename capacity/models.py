from django.conf import settings
from django.db import models

from capacity.constants import SOURCE_API, SOURCE_COMMAND, SOURCE_FLOWER


class CapacityConfig(models.Model):
    """One version of the capacity config.

    Rows are only ever added, never changed or deleted: the newest row is the config in force and the
    older ones are its history. With no row at all, the defaults apply. Change the config through
    capacity.config.save_config (the staff endpoints and `manage.py capacity` do), which validates the
    change and logs it.
    """

    SOURCES = [(SOURCE_API, 'API'), (SOURCE_COMMAND, 'Management command'),
               (SOURCE_FLOWER, 'A pool resized by hand (Flower, celery control)')]

    config = models.JSONField(help_text='The full config this version put in force.')
    previous_config = models.JSONField(null=True, blank=True, help_text='The config in force before it.')
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name='+')
    created_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(max_length=16, choices=SOURCES)
    note = models.TextField(blank=True, default='')

    class Meta:
        db_table = 'capacity_configs'

    def __str__(self):
        return f'capacity config v{self.pk}'

    @classmethod
    def get_latest(cls):
        """The version in force, or None when the defaults apply."""
        return cls.objects.order_by('-id').first()
