"""Concept repositories: a `Source` (one current version per org and mnemonic) and its `Concept` rows.

A source is reloaded in place by `manage.py load_terminology`: its `version` and `checksum` change and the
concept rows are upserted. A concept's `definition` (HPO's `def:`) is indexed for semantic matching as an
extra entry of the concept, never shown as one of its names. `checksum` is a digest of the loaded content,
so two loads of the same version with different content (say `--limit`) still give the matching indexes
different keys.
"""
from django.db import models


class Source(models.Model):
    org = models.CharField(max_length=64)
    mnemonic = models.CharField(max_length=64)
    name = models.CharField(max_length=255)
    version = models.CharField(max_length=64)
    description = models.TextField(blank=True, default='')
    checksum = models.CharField(max_length=64, blank=True, default='',
                                help_text='sha256 of the loaded concepts (see concepts.terminology).')
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=['org', 'mnemonic'], name='concepts_source_org_mnemonic'),
        ]
        ordering = ['org', 'mnemonic']

    def __str__(self):
        return f'{self.org}/{self.mnemonic} {self.version}'

    @property
    def url(self):
        """What clients pass as `target_repo_url`."""
        return source_url(self.org, self.mnemonic)


def source_url(org, mnemonic):
    return f'/orgs/{org}/sources/{mnemonic}/'


class Concept(models.Model):
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name='concepts')
    code = models.CharField(max_length=64)
    name = models.CharField(max_length=1024)
    concept_class = models.CharField(max_length=128, blank=True, default='')
    synonyms = models.JSONField(default=list, blank=True)
    definition = models.TextField(blank=True, default='')

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=['source', 'code'], name='concepts_concept_source_code'),
        ]
        indexes = [models.Index(fields=['source'], name='concepts_concept_source')]
        ordering = ['source', 'code']

    def __str__(self):
        return f'{self.code} {self.name}'
