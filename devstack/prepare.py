"""The one-shot steps the launcher runs in children of their own (python -m devstack --prepare /
--build-indexes): the database, then the match indexes. Django is imported only when a step runs."""
import os
import signal
import sys
import time

TERMINOLOGY = 'hpo'


def _setup_django():
    import django

    # Let SIGTERM unwind (finally blocks, the index store's temporary directories) instead of killing.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
    django.setup()


def prepare():
    """migrate, load the terminology, create the demo users; each is idempotent and quick the second time."""
    _setup_django()
    from django.core.management import call_command

    for label, args in (('migrate', ['migrate', '--noinput']),
                        (f'load_terminology {TERMINOLOGY}', ['load_terminology', TERMINOLOGY]),
                        ('create_demo_users', ['create_demo_users'])):
        started = time.monotonic()
        print(f'--- {label}', flush=True)
        call_command(*args)
        print(f'--- {label}: {time.monotonic() - started:.1f} s', flush=True)
    return 0


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
