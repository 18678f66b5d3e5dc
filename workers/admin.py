"""Calls and their work in Django's admin (/admin/workers/call/, /admin/workers/work/), for every staff user.

Read-only: every state change of a call or a work is one function of workers.lifecycle, with its guarded
UPDATE, its leases and its log line (CONVENTIONS.md); a row edited here would skip all of that. The one
change offered is the owner's own: "Cancel the selected calls" cancels each through lifecycle.cancel, as
DELETE /tasks/<id>/ does (its leases go back, a running work is stopped where it runs). Staff may read them
without model permissions, as they read any call at GET /tasks/<id>/ and GET /tasks/?user=.
"""
from django.contrib import admin, messages

from common.admin import StaffReadOnly
from workers.models import Call, Work

# workers.lifecycle is imported where it is used: Django loads this module while workers.celery is being
# imported (its django.setup()), and the lifecycle imports workers.celery.


class EveryFieldShown(StaffReadOnly):
    """Every field of the model shown, none editable."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]


@admin.register(Call)
class CallAdmin(EveryFieldShown):
    list_display = ('id', 'owner', 'endpoint', 'state', 'rows', 'run_id', 'served_as', 'queue', 'created_at',
                    'cancelled_at')
    list_filter = ('endpoint', 'served_as', 'work__state', 'work__queue', 'created_at')
    search_fields = ('id', 'work__id', 'run_id', 'owner__username', 'idempotency_key', 'request_id')
    date_hierarchy = 'created_at'
    ordering = ('-created_at',)
    list_select_related = ('owner', 'work')
    actions = ('cancel_calls',)

    @admin.display(description='state')
    def state(self, call):
        """What its owner sees (lifecycle.seen): its work's state, or cancelled once cancelled."""
        from workers.lifecycle.seen import seen
        return seen(call, call.work).state

    @admin.display(description='queue')
    def queue(self, call):
        return call.work.queue

    @admin.action(description='Cancel the selected calls (as their owner would)')
    def cancel_calls(self, request, queryset):
        from workers import lifecycle
        cancelled = sum(1 for call in queryset.select_related('work') if lifecycle.cancel(call) is not None)
        self.message_user(request, f'{cancelled} call(s) cancelled; the others had ended already.',
                          messages.SUCCESS if cancelled else messages.INFO)


@admin.register(Work)
class WorkAdmin(EveryFieldShown):
    list_display = ('id', 'endpoint', 'queue', 'state', 'rows', 'rows_done', 'holders', 'attempts', 'worker',
                    'created_at', 'started_at', 'finished_at')
    list_filter = ('state', 'queue', 'endpoint', 'shared', 'created_at')
    search_fields = ('id', 'worker', 'work_key')
    date_hierarchy = 'created_at'
    ordering = ('-created_at',)
