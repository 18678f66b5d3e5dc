"""The one-shot steps the launcher runs in children of their own (python -m devstack --prepare /
--build-indexes): the database and the lexical indexes, then the semantic indexes. Django is imported only
when a step runs."""
import os
import resource
import signal
import sys
import time
from pathlib import Path

from devstack import files

TERMINOLOGY = 'hpo'
SETUP_FILE = 'setup.json'  # in VAR_DIR: what the prepare step left to build (semantic_missing: source urls)


def _setup_django():
    import django

    # Let SIGTERM unwind (finally blocks, the index store's temporary directories) instead of killing.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
    django.setup()


def _step(label, run):
    started = time.monotonic()
    print(f'--- {label}', flush=True)
    run()
    print(f'--- {label}: {time.monotonic() - started:.1f} s', flush=True)


def prepare():
    """migrate, load the terminology, create the demo users, collect the static files the API serves (the
    admin's, the lanes page's, Swagger UI's: WhiteNoise serves only what was collected, as in production),
    build the lexical indexes (seconds); each is idempotent and quick the second time. Then note in
    VAR_DIR/setup.json the sources whose semantic index is not built yet: the launcher builds those after its
    banner (build_indexes)."""
    _setup_django()
    from django.core.management import call_command

    from concepts.matching import store
    from concepts.matching.embedders import make_embedder
    from concepts.models import Source
    from concepts.services import embedder_name

    _step('migrate', lambda: call_command('migrate', '--noinput'))
    _step(f'load_terminology {TERMINOLOGY}', lambda: call_command('load_terminology', TERMINOLOGY))
    _step('create_demo_users', lambda: call_command('create_demo_users'))
    _step('collectstatic', collect_static)
    sources = list(Source.objects.all())
    _step('lexical indexes', lambda: [store.build_missing(source, embedder_name(), semantic=False)
                                      for source in sources])
    embedder = make_embedder(embedder_name())
    missing = [source.url for source in sources
               if not store.semantic_directory(store.source_key(source), embedder).is_dir()]
    files.write_private(files.var_dir() / SETUP_FILE, {'semantic_missing': missing})
    print(f'semantic indexes to build: {", ".join(missing) or "none"}', flush=True)
    return 0


def semantic_missing(var):
    """The source urls whose semantic index the prepare step found missing (None: it didn't say)."""
    return (files.read_private(var / SETUP_FILE) or {}).get('semantic_missing')


def collect_static():
    """`collectstatic` into STATIC_ROOT unless the files there were collected from the same sources: it hashes
    and gzips every file each time (3-10 s on 2 cores), and most starts change none. True when it collected."""
    from django.conf import settings
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.core.management import call_command

    stamp = Path(settings.VAR_DIR) / 'static-sources.sha256'
    digest = static_sources_digest()
    manifest = getattr(staticfiles_storage, 'manifest_name', None)
    collected = manifest is None or staticfiles_storage.exists(manifest)
    if collected and stamp.exists() and stamp.read_text() == digest:
        print(f'static files in {settings.STATIC_ROOT} already collected from these sources', flush=True)
        return False
    stamp.unlink(missing_ok=True)
    call_command('collectstatic', '--noinput')
    stamp.write_text(digest)
    return True


def static_sources_digest():
    """A digest of what collectstatic would gather (each source file's name, size and modification time), where
    it would put it and the storage that post-processes it."""
    import hashlib

    from django.conf import settings
    from django.contrib.staticfiles import finders

    sources = []
    for finder in finders.get_finders():
        for path, storage in finder.list([]):
            stat = os.stat(storage.path(path))
            sources.append(f'{getattr(storage, "prefix", None) or ""}/{path} {stat.st_size} {stat.st_mtime_ns}')
    head = f'{settings.STATIC_ROOT}\n{settings.STORAGES["staticfiles"]}\n'
    return hashlib.sha256((head + '\n'.join(sorted(sources))).encode()).hexdigest()


def build_indexes():
    """The lexical and semantic index of every loaded source: built once into VAR_DIR; a later run only
    finds them there (the lane workers load them). A build runs the sentence model on every core
    (concepts.matching.minilm.build_threads) and prints how far it got about every 10 s."""
    _setup_django()
    from concepts.matching import store
    from concepts.models import Source
    from concepts.services import embedder_name

    started = time.monotonic()
    done = []
    for source in Source.objects.all():
        built = store.build_missing(source, embedder_name(),
                                    report=lambda line, url=source.url: print(f'{url} {line}', flush=True))
        done.append(f'{source.url} ({", ".join(built) + " built" if built else "already built"})')
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(f'match indexes of {", ".join(done) or "no source"} ready in {time.monotonic() - started:.1f} s '
          f'({used.ru_utime + used.ru_stime:.0f} s of CPU)', flush=True)
    return 0
