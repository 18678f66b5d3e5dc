from django.contrib import admin

from concepts.models import Concept, Source


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    list_display = ('org', 'mnemonic', 'name', 'version', 'updated_at')


@admin.register(Concept)
class ConceptAdmin(admin.ModelAdmin):
    list_display = ('code', 'name', 'concept_class', 'source')
    list_filter = ('source',)
    search_fields = ('code', 'name')
