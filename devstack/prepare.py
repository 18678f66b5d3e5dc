"""The one-shot steps the launcher runs in children of their own (python -m devstack --prepare /
--build-indexes): the database, then the match indexes. Django is imported only when a step runs."""
import os
import signal
import sys
import time
from pathlib import Path

TERMINOLOGY = 'hpo'


def _setup_django():
    import django

    # Let SIGTERM unwind (finally blocks, the index store's temporary directories) instead of killing.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
    django.setup()


def prepare():
    """migrate, load the terminology, create the demo users, collect the static files the API serves (the
    admin's, the lanes page's, Swagger UI's: WhiteNoise serves only what was collected, as in production); each
    is idempotent and quick the second time."""
    _setup_django()
    from django.core.management import call_command

    for label, step in (('migrate', lambda: call_command('migrate', '--noinput')),
                        (f'load_terminology {TERMINOLOGY}', lambda: call_command('load_terminology', TERMINOLOGY)),
                        ('create_demo_users', lambda: call_command('create_demo_users')),
                        ('collectstatic', collect_static)):
        started = time.monotonic()
        print(f'--- {label}', flush=True)
        step()
        print(f'--- {label}: {time.monotonic() - started:.1f} s', flush=True)
    return 0


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
    (concepts.matching.minilm.build_threads)."""
    _setup_django()
    from concepts.matching import store
    from concepts.models import Source
    from concepts.services import embedder_name

    started = time.monotonic()
    done = []
    for source in Source.objects.all():
        built = store.build_missing(source, embedder_name())
        done.append(f'{source.url} ({", ".join(built) + " built" if built else "already built"})')
    print(f'match indexes of {", ".join(done) or "no source"} ready in {time.monotonic() - started:.1f} s',
          flush=True)
    return 0
