"""Where indexes live, and how processes build them once and share them.

Layout, one directory per part::

    <VAR_DIR>/indexes/<org>/<mnemonic>/<version>-<checksum[:16]>/lexical-bm25/
    <VAR_DIR>/indexes/<org>/<mnemonic>/<version>-<checksum[:16]>/semantic-<embedder cache key>/

The key is the source's content (its `checksum`, set by the loader), so a reload that changes the source
gets new indexes and one that changes nothing keeps the old ones. The embedder's cache key names its
settings and library version, so an index is never loaded by code that did not write it.

Build once: the first process that needs a missing part takes an exclusive `flock` on ``<part>.lock``,
looks again (another process may have finished it meanwhile), builds into a temporary directory beside
the target and renames it into place. The rename is atomic, so a reader sees a whole part or none.
Processes waiting on the lock load the finished part instead of building it again.

While a part is built, its builder keeps ``<part>.state.json`` beside the lock: the step, texts done of
total, when it started (``BuildProgress``), and at the end how long it took or the error it failed with.
`part_status(directory)` reads it back for status pages: ``ready`` (the directory is there), ``building``
(someone holds the part's lock: a build, or a process waiting its turn), ``failed`` (the last build's
error, no build running), or ``missing`` (never built, or its builder died).

Each process keeps the parts it loaded in an LRU cache of ``CONCEPTS_INDEX_CACHE_SIZE`` parts (default 8);
calls never rebuild or reload a cached part. `BUILDS` counts the builds this process did, per kind.
"""
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from concepts.errors import ConceptsError
from concepts.matching.embedders import make_embedder
from concepts.matching.index import LexicalIndex, SemanticIndex
from concepts.matching.table import ConceptRow, ConceptTable
from common.database import locked_with_connection
from common.process import PerProcess
from concepts.terminology import concepts_checksum

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the atomic rename alone keeps parts whole
    fcntl = None

DEFAULT_CACHE_SIZE = 8
READ_ATTEMPTS = 3
STATE_WRITE_SECONDS = 1.0  # a build's state file is rewritten at most this often (and at each new step)
REPORT_SECONDS = 10.0      # a build tells its `report` how far it got about this often
BUILDS = Counter()

# Loaded parts are inherited by a forked pool process (copy-on-write); the locks are not: pool processes are
# forked from a worker whose other threads may hold them at that moment, so each process gets its own.
_cache = OrderedDict()
_cache_lock = PerProcess(threading.Lock)
_build_locks = PerProcess(dict)


@dataclass(frozen=True)
class IndexKey:
    org: str
    mnemonic: str
    version: str
    checksum: str

    def directory(self, root):
        content = f'{_safe(self.version)}-{self.checksum[:16]}'
        return Path(root) / _safe(self.org) / _safe(self.mnemonic) / content


def _safe(part):
    return re.sub(r'[^A-Za-z0-9._-]+', '_', part) or '_'


def index_root():
    return Path(settings.VAR_DIR) / 'indexes'


def read_rows(source):
    return [ConceptRow(code, name, concept_class, tuple(synonyms), definition)
            for code, name, concept_class, synonyms, definition in source.concepts.order_by('code').values_list(
                'code', 'name', 'concept_class', 'synonyms', 'definition')]


def read_source(source):
    """(IndexKey, rows) of a source, read consistently: the rows' checksum is the key's.

    The loader writes the checksum of what it loaded, so a mismatch means a reload ran between our two
    reads; read again. A source made by hand, with no checksum, gets the checksum of its rows.
    """
    from concepts.models import Source
    for _ in range(READ_ATTEMPTS):
        rows = read_rows(source)
        checksum = concepts_checksum(rows)
        if not source.checksum or source.checksum == checksum:
            return IndexKey(source.org, source.mnemonic, source.version, checksum), rows
        source = Source.objects.get(pk=source.pk)
    raise ConceptsError(f'{source.url} kept changing while it was read for indexing; try again')


def source_key(source):
    """The key of a source's current content, without reading its concepts when the loader set a checksum."""
    if source.checksum:
        return IndexKey(source.org, source.mnemonic, source.version, source.checksum)
    return read_source(source)[0]


def lexical_directory(key):
    return key.directory(index_root()) / 'lexical-bm25'


def semantic_directory(key, embedder):
    return key.directory(index_root()) / f'semantic-{embedder.cache_key}'


def build_missing(source, embedder_name, lexical=True, semantic=True, report=None):
    """Build the source's lexical and (or) semantic index where they aren't on disk yet, without loading the
    ones that are; the names of the parts built. `report(line)` hears how a build is going."""
    key = source_key(source)
    built = []
    if lexical and not lexical_directory(key).is_dir():
        lexical_index(source, report=report)
        built.append('lexical')
    if semantic and not semantic_directory(key, make_embedder(embedder_name)).is_dir():
        semantic_index(source, embedder_name, report=report)
        built.append('semantic')
    return built


def lexical_index(source, build=True, report=None):
    """The source's BM25 index: from this process's cache, else from disk, else built (once, anywhere);
    without `build`, None when it isn't built yet. `report(line)`: see `BuildProgress`."""
    key = source_key(source)
    directory = lexical_directory(key)
    if not build and not directory.is_dir():
        return None
    return _get(directory, kind='lexical-bm25',
                build=lambda progress: LexicalIndex.build(_table(source, key)),
                load=lambda: LexicalIndex.load(directory), report=report)


def semantic_index(source, embedder_name, build=True, report=None):
    """The source's embedding index for the named embedder (see `lexical_index`)."""
    key = source_key(source)
    embedder = make_embedder(embedder_name)
    directory = semantic_directory(key, embedder)
    if not build and not directory.is_dir():
        return None
    return _get(directory, kind=f'semantic-{embedder.name}',
                build=lambda progress: SemanticIndex.build(_table(source, key), embedder, progress),
                load=lambda: SemanticIndex.load(directory, embedder), report=report)


def _table(source, key):
    read_key, rows = read_source(source)
    if read_key != key:
        raise ConceptsError(f'{source.url} changed while its index was being built; try again')
    return ConceptTable.build(rows)


def _get(directory, kind, build, load, report=None):
    name = str(directory)
    with _cache_lock.get():
        if name in _cache:
            _cache.move_to_end(name)
            return _cache[name]
        part_lock = _build_locks.get().setdefault(name, threading.Lock())
    # One thread per process builds or loads a part; the others then find it cached. A build reads the
    # source's concepts: a connection first (common.database).
    with locked_with_connection(part_lock):
        with _cache_lock.get():
            if name in _cache:
                return _cache[name]
        index = _load_or_build(directory, kind, build, load, report)
        with _cache_lock.get():
            _cache[name] = index
            while len(_cache) > getattr(settings, 'CONCEPTS_INDEX_CACHE_SIZE', DEFAULT_CACHE_SIZE):
                _cache.popitem(last=False)
        return index


def _load_or_build(directory, kind, build, load, report=None):
    if directory.is_dir():
        return load()
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(lock_path(directory)):
        if directory.is_dir():
            return load()
        progress = BuildProgress(state_path(directory), kind, report)
        temporary = directory.parent / f'.{directory.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp'
        try:
            index = build(progress.update)
            progress.update('saving')
            temporary.mkdir()
            index.save(temporary)
            os.rename(temporary, directory)
        except BaseException as error:
            shutil.rmtree(temporary, ignore_errors=True)
            progress.failed(error)
            raise
        BUILDS[kind] += 1
        progress.ready()
        return index


def lock_path(directory):
    return directory.parent / f'{directory.name}.lock'


def state_path(directory):
    return directory.parent / f'{directory.name}.state.json'


class BuildProgress:
    """The state file of one part's build (written by the process that holds its lock), and its reports.

    ``{"state": "building" | "ready" | "failed", "kind", "step", "done", "total", "started_at",
    "updated_at", "seconds", "error", "pid", "host"}``; times are Unix seconds, ``done`` of ``total`` counts
    the step's units (texts, for an embedding) or is null. Rewritten atomically at most every
    STATE_WRITE_SECONDS, and at every new step; `report(line)`, when given, hears a line at every step and
    about every REPORT_SECONDS."""

    def __init__(self, path, kind, report=None, clock=time.time):
        self.path = path
        self.report = report
        self.clock = clock
        self.started = clock()
        self.written = self.reported = float('-inf')
        self.state = {'state': 'building', 'kind': kind, 'step': 'reading the source', 'done': None,
                      'total': None, 'started_at': self.started, 'updated_at': self.started, 'seconds': None,
                      'error': None, 'pid': os.getpid(), 'host': socket.gethostname()}
        self._write(force=True)

    def update(self, step, done=None, total=None):
        """The build is at `step`, `done` of `total` (or neither)."""
        new_step = step != self.state['step']
        self.state.update(step=step, done=done, total=total, updated_at=self.clock())
        self._write(force=new_step)

    def ready(self):
        now = self.clock()
        self.state['state'] = 'ready'  # an item, not update(state=): only the lifecycle writes a `state=`
        self.state.update(step='ready', updated_at=now, seconds=round(now - self.started, 1))
        self._write(force=True)

    def failed(self, error):
        now = self.clock()
        self.state['state'] = 'failed'
        self.state.update(updated_at=now, seconds=round(now - self.started, 1),
                          error=f'{type(error).__name__}: {error}'[:500])
        self._write(force=True)

    def line(self):
        state = self.state
        elapsed = state['updated_at'] - self.started
        if state['state'] != 'building':
            return f'{state["kind"]}: {state["state"]} in {elapsed:.1f} s' + (
                f' ({state["error"]})' if state['error'] else '')
        done = (f' {state["done"]:,} of {state["total"]:,} ({100 * state["done"] / max(state["total"], 1):.0f} %)'
                if state['total'] else '')
        return f'{state["kind"]}: {state["step"]}{done}, {elapsed:.1f} s'

    def _write(self, force=False):
        now = self.clock()
        if force or now - self.written >= STATE_WRITE_SECONDS:
            self.written = now
            temporary = self.path.with_name(f'.{self.path.name}.{os.getpid()}.tmp')
            try:
                temporary.write_text(json.dumps(self.state))
                os.replace(temporary, self.path)
            except OSError:  # a state file is for status pages: never what fails a build
                pass
        if self.report is not None and (force or now - self.reported >= REPORT_SECONDS):
            self.reported = now
            self.report(self.line())


def part_status(directory, clock=time.time):
    """What a status page says of the part in `directory`: {"state": "ready" | "building" | "failed" |
    "missing", "step", "done", "total", "elapsed_seconds", "error"} (see the module's docstring). Reads
    only: it never builds, loads or waits."""
    try:
        saved = json.loads(state_path(directory).read_text())
    except (OSError, ValueError):
        saved = {}
    if directory.is_dir():
        state = 'ready'
    elif _locked(lock_path(directory)):
        state = 'building'
    elif saved.get('state') == 'failed':
        state = 'failed'
    else:
        state = 'missing'
    status = {'state': state}
    if state == 'building' and saved.get('state') == 'building':
        status.update(step=saved.get('step'), done=saved.get('done'), total=saved.get('total'),
                      elapsed_seconds=round(clock() - saved.get('started_at', clock()), 1))
    elif state == 'building':  # its builder has not written its state yet (or waits for the lock)
        status.update(step='waiting to start', done=None, total=None, elapsed_seconds=None)
    elif state in ('ready', 'failed') and saved.get('state') == state:
        status['elapsed_seconds'] = saved.get('seconds')
    if state == 'failed':
        status['error'] = saved.get('error')
    return status


def _locked(path):
    """Whether some process holds the lock file `path` (it is not created here)."""
    if fcntl is None:
        return False
    try:
        handle = open(path, 'rb')  # noqa: SIM115 - closed below, whatever the probe found
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False


@contextmanager
def _file_lock(path):
    with open(path, 'a+b') as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def clear_cache():
    """Forget every loaded part in this process (the files stay): the next call loads from disk."""
    with _cache_lock.get():
        _cache.clear()


def prune(source, keep=None):
    """Delete the source's index directories other than those of `keep` (an IndexKey; default: current).

    Processes that already loaded a pruned part keep using it from memory.
    """
    keep = keep or source_key(source)
    base = keep.directory(index_root()).parent
    removed = []
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if child.is_dir() and child.name != keep.directory(index_root()).name:
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed
