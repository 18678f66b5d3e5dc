"""The one way this service shows records in Django's admin: every active staff user reads them, nobody edits.

The capacity config's versions and the calls and their work each change through one function (save_config,
workers.lifecycle) that validates, records and logs; a row edited, added or deleted in the admin would skip
it. Staff need no model permissions to read them, as they read the same records through the API.
"""
from django.contrib import admin


class StaffReadOnly(admin.ModelAdmin):
    """Every active staff user views; nobody adds, changes or deletes here."""

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
