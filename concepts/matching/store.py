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

Each process keeps the parts it loaded in an LRU cache of ``CONCEPTS_INDEX_CACHE_SIZE`` parts (default 8);
calls never rebuild or reload a cached part. `BUILDS` counts the builds this process did, per kind.
"""
import os
import re
import shutil
import threading
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


def build_missing(source, embedder_name):
    """Build the source's lexical and semantic index where they aren't on disk yet, without loading the
    ones that are; the names of the parts built."""
    key = source_key(source)
    built = []
    if not lexical_directory(key).is_dir():
        lexical_index(source)
        built.append('lexical')
    if not semantic_directory(key, make_embedder(embedder_name)).is_dir():
        semantic_index(source, embedder_name)
        built.append('semantic')
    return built


def lexical_index(source, build=True):
    """The source's BM25 index: from this process's cache, else from disk, else built (once, anywhere);
    without `build`, None when it isn't built yet."""
    key = source_key(source)
    directory = lexical_directory(key)
    if not build and not directory.is_dir():
        return None
    return _get(directory, kind='lexical-bm25', build=lambda: LexicalIndex.build(_table(source, key)),
                load=lambda: LexicalIndex.load(directory))


def semantic_index(source, embedder_name, build=True):
    """The source's embedding index for the named embedder (see `lexical_index`)."""
    key = source_key(source)
    embedder = make_embedder(embedder_name)
    directory = semantic_directory(key, embedder)
    if not build and not directory.is_dir():
        return None
    return _get(directory, kind=f'semantic-{embedder.name}',
                build=lambda: SemanticIndex.build(_table(source, key), embedder),
                load=lambda: SemanticIndex.load(directory, embedder))


def _table(source, key):
    read_key, rows = read_source(source)
    if read_key != key:
        raise ConceptsError(f'{source.url} changed while its index was being built; try again')
    return ConceptTable.build(rows)


def _get(directory, kind, build, load):
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
        index = _load_or_build(directory, kind, build, load)
        with _cache_lock.get():
            _cache[name] = index
            while len(_cache) > getattr(settings, 'CONCEPTS_INDEX_CACHE_SIZE', DEFAULT_CACHE_SIZE):
                _cache.popitem(last=False)
        return index


def _load_or_build(directory, kind, build, load):
    if directory.is_dir():
        return load()
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(directory.parent / f'{directory.name}.lock'):
        if directory.is_dir():
            return load()
        index = build()
        BUILDS[kind] += 1
        temporary = directory.parent / f'.{directory.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp'
        temporary.mkdir()
        try:
            index.save(temporary)
            os.rename(temporary, directory)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        return index


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
