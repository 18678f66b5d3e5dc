"""Indexes are built once per source content and embedder, persisted, and reused by every process."""
import multiprocessing

import pytest

from concepts.loader import load_terminology
from concepts.matching import store
from concepts.terminology import read_tiny
from tests.integration.concepts import store_child


def part_dirs(root):
    return sorted(p for p in root.glob('*/*/*/*') if p.is_dir())


@pytest.mark.django_db
def test_a_built_index_is_saved_and_a_new_process_loads_it_without_refitting(tiny_source, isolated_indexes):
    before = store.BUILDS.copy()
    semantic = store.semantic_index(tiny_source, 'tfidf-svd')
    lexical = store.lexical_index(tiny_source)
    assert store.BUILDS - before == {'semantic-tfidf-svd': 1, 'lexical-bm25': 1}
    dirs = part_dirs(isolated_indexes)
    assert [d.name.split('-sklearn')[0] for d in dirs] == ['lexical-bm25', 'semantic-tfidf-svd-256d-35']
    mtimes = [d.stat().st_mtime_ns for d in dirs]

    # Same process: the cached objects themselves.
    assert store.semantic_index(tiny_source, 'tfidf-svd') is semantic
    assert store.lexical_index(tiny_source) is lexical

    # As a fresh process would: nothing cached, so both load from disk.
    store.clear_cache()
    reloaded = store.semantic_index(tiny_source, 'tfidf-svd')
    store.lexical_index(tiny_source)
    assert reloaded is not semantic
    assert store.BUILDS - before == {'semantic-tfidf-svd': 1, 'lexical-bm25': 1}
    assert [d.stat().st_mtime_ns for d in part_dirs(isolated_indexes)] == mtimes
    assert reloaded.search(['hypertenison'], 1) == semantic.search(['hypertenison'], 1)


@pytest.mark.django_db
def test_build_missing_builds_only_what_is_not_on_disk_and_loads_nothing(tiny_source, isolated_indexes):
    before = store.BUILDS.copy()
    assert store.build_missing(tiny_source, 'tfidf-svd') == ['lexical', 'semantic']
    assert store.BUILDS - before == {'semantic-tfidf-svd': 1, 'lexical-bm25': 1}
    store.clear_cache()
    assert store.build_missing(tiny_source, 'tfidf-svd') == []
    assert store._cache == {}  # found on disk, not loaded
    assert store.BUILDS - before == {'semantic-tfidf-svd': 1, 'lexical-bm25': 1}


@pytest.mark.django_db
def test_a_reload_that_changes_the_source_gets_a_new_index(tiny_source, isolated_indexes):
    old = store.lexical_index(tiny_source)
    assert old.search(['xylophone'], 1) == [[]]
    tiny = read_tiny()
    extra = type(tiny.concepts[0])('TC999', 'Xylophone player cramp', 'Finding', ())
    load_terminology(type(tiny)(tiny.org, tiny.mnemonic, tiny.name, tiny.version, tiny.description,
                                tiny.concepts + (extra,)))
    tiny_source.refresh_from_db()
    new = store.lexical_index(tiny_source)
    assert new is not old
    assert new.table.codes[new.search(['xylophone'], 1)[0][0].concept] == 'TC999'
    assert len(list(isolated_indexes.glob('HL/TinyClinical/*'))) == 2
    removed = store.prune(tiny_source)
    assert len(removed) == 1 and len(list(isolated_indexes.glob('HL/TinyClinical/*'))) == 1


@pytest.mark.django_db
def test_an_unchanged_reload_keeps_using_the_same_index(tiny_source, isolated_indexes):
    first = store.lexical_index(tiny_source)
    load_terminology(read_tiny())
    tiny_source.refresh_from_db()
    assert store.lexical_index(tiny_source) is first


def test_two_processes_needing_the_same_missing_index_build_it_exactly_once(tmp_path):
    context = multiprocessing.get_context('spawn')
    results = context.Queue()
    directory = tmp_path / 'indexes' / 'org' / 'src' / 'v-abc' / 'part'
    barrier = context.Barrier(4)
    children = [context.Process(target=store_child.build_or_load, args=(str(directory), barrier, results))
                for _ in range(4)]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=30) for _ in children]
    for child in children:
        child.join(timeout=10)
    assert sum(builds for _, _, builds in outcomes) == 1
    builder = (directory / 'built-by').read_text()
    assert {seen for _, seen, _ in outcomes} == {builder}  # everyone uses the one complete build
    assert not list(directory.parent.glob('.*.tmp'))
