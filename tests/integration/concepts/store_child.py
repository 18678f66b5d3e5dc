"""Runs in a spawned child process of test_store: imports no Django model, so it needs no app registry."""
import os
import time
from pathlib import Path

from concepts.matching import store


class SlowIndex:
    """Stands in for an index whose build takes long enough for processes to collide."""

    def __init__(self, builder):
        self.builder = builder

    def save(self, directory):
        (Path(directory) / 'built-by').write_text(self.builder)


def build_or_load(directory, barrier, results):
    def build(progress):
        time.sleep(0.3)
        return SlowIndex(str(os.getpid()))

    barrier.wait(timeout=30)  # every child is up and imported: they all look for the part at once
    directory = Path(directory)
    index = store._load_or_build(directory, 'slow', build,
                                 load=lambda: SlowIndex((directory / 'built-by').read_text()))
    results.put((os.getpid(), index.builder, store.BUILDS['slow']))
