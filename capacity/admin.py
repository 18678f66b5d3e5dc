"""The capacity config's history in Django's admin, read-only for every staff user.

A change goes through capacity.config.save_config (PATCH /capacity/config/, the lanes page, `manage.py
capacity`), which validates it and records who, when, why and the log line; a row edited or added here would
skip all of that, so the admin only shows the versions. Staff may read them without model permissions: they
read the same history at GET /capacity/config/history/.
"""
from django.contrib import admin
from django.utils.html import format_html_join

from capacity.config import diff
from common.admin import StaffReadOnly
from capacity.models import CapacityConfig


@admin.register(CapacityConfig)
class CapacityConfigAdmin(StaffReadOnly):
    list_display = ('__str__', 'created_at', 'created_by', 'source', 'note', 'changes')
    list_filter = ('source', 'created_at')
    search_fields = ('note', 'created_by__username')
    date_hierarchy = 'created_at'
    ordering = ('-id',)
    list_select_related = ('created_by',)
    fields = ('created_at', 'created_by', 'source', 'note', 'changes', 'config', 'previous_config')
    readonly_fields = fields

    @admin.display(description='changes')
    def changes(self, row):
        """Each setting this version changed, `path: old → new`."""
        return format_html_join(', ', '<code>{}</code>: {} → {}', (
            (path, old, new) for path, (old, new) in diff(row.previous_config, row.config).items()))
