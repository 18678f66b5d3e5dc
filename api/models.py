"""Usage metering: one row per admitted heavy call, refunded when the call fails."""
from django.conf import settings
from django.db import models


class UsageEvent(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name='usage_events')
    call_id = models.CharField(max_length=32, unique=True)  # one charge per heavy call, whatever the retries
    action = models.CharField(max_length=32)
    units = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    refunded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = 'usage_events'

    def __str__(self):
        return f'{self.user_id} {self.action} {self.units}'
