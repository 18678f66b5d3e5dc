"""Load a `Terminology` into the database: one transaction, bulk upserts, and a summary of what changed.

A load makes the source's concepts exactly the terminology's: new codes are created, changed ones
updated, codes no longer present deleted, and unchanged rows are not written at all, so loading the same
terminology twice changes nothing the second time (`LoadSummary.changed` is False).
"""
import time
from dataclasses import dataclass

from django.db import transaction

from concepts.models import Concept, Source

BATCH_SIZE = 2000


@dataclass(frozen=True)
class LoadSummary:
    url: str
    version: str
    concepts: int
    created: int
    updated: int
    deleted: int
    unchanged: int
    source_created: bool
    source_updated: bool
    seconds: float

    @property
    def changed(self):
        return bool(self.created or self.updated or self.deleted
                    or self.source_created or self.source_updated)


def _no_progress(stage, done, total):
    pass


def load_terminology(terminology, progress=_no_progress):
    """Upsert `terminology` into its Source; `progress(stage, done, total)` is called after each batch."""
    started = time.monotonic()
    checksum = terminology.checksum
    fields = {'name': terminology.name, 'version': terminology.version,
              'description': terminology.description, 'checksum': checksum}
    with transaction.atomic():
        source, source_created = Source.objects.select_for_update().get_or_create(
            org=terminology.org, mnemonic=terminology.mnemonic, defaults=fields)
        stored = Concept.objects.filter(source=source).values_list(
            'id', 'code', 'name', 'concept_class', 'synonyms', 'definition')
        existing = {code: (pk, name, concept_class, synonyms, definition)
                    for pk, code, name, concept_class, synonyms, definition in stored}
        to_create, to_update = [], []
        wanted = set()
        for concept in terminology.concepts:
            wanted.add(concept.code)
            synonyms = list(concept.synonyms)
            row = existing.get(concept.code)
            fields_of = {'code': concept.code, 'name': concept.name, 'concept_class': concept.concept_class,
                         'synonyms': synonyms, 'definition': concept.definition}
            if row is None:
                to_create.append(Concept(source=source, **fields_of))
            elif row[1:] != (concept.name, concept.concept_class, synonyms, concept.definition):
                to_update.append(Concept(id=row[0], source=source, **fields_of))
        to_delete = [row[0] for code, row in existing.items() if code not in wanted]

        for stage, items in (('create', to_create), ('update', to_update), ('delete', to_delete)):
            for start in range(0, len(items), BATCH_SIZE):
                batch = items[start:start + BATCH_SIZE]
                if stage == 'create':
                    Concept.objects.bulk_create(batch)
                elif stage == 'update':
                    Concept.objects.bulk_update(batch, ['name', 'concept_class', 'synonyms', 'definition'])
                else:
                    Concept.objects.filter(id__in=batch).delete()
                progress(stage, start + len(batch), len(items))

        source_updated = False
        if not source_created and any(getattr(source, key) != value for key, value in fields.items()):
            for key, value in fields.items():
                setattr(source, key, value)
            source.save()
            source_updated = True

    return LoadSummary(
        url=source.url, version=source.version, concepts=len(terminology.concepts),
        created=len(to_create), updated=len(to_update), deleted=len(to_delete),
        unchanged=len(terminology.concepts) - len(to_create) - len(to_update),
        source_created=source_created, source_updated=source_updated,
        seconds=time.monotonic() - started)
