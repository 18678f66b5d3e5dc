"""A lane worker loads the match indexes before its pool forks (workers.signals.warm_indexes), so a pool
process's first call finds them in its cache."""
import gc
import logging

import pytest

from concepts import services
from concepts.matching import minilm, store
from workers import signals


@pytest.fixture(autouse=True)
def unfrozen():
    """warm_indexes freezes what is loaded out of the collector's reach; give it back after each test."""
    yield
    gc.unfreeze()


def test_warm_loads_nothing_it_would_have_to_build(tiny_source):
    builds = dict(store.BUILDS)
    assert services.warm() == 0 and not store._cache and dict(store.BUILDS) == builds


def build(source):
    store.lexical_index(source)
    store.semantic_index(source, services.embedder_name())
    store.clear_cache()


def test_warm_loads_every_sources_parts_into_the_cache(tiny_source):
    build(tiny_source)
    minilm._runtime.clear()  # the build above ran the model in this process
    assert services.warm() == 2
    # Loading reads arrays only: no model session (threads of its own) in a process that forks afterwards.
    assert minilm._runtime.peek() is None
    builds = dict(store.BUILDS)
    payload = services.validate_match({'rows': [{'name': 'chest pain'}], 'target_repo_url': tiny_source.url})
    services.run_match(payload, semantic=True, reranker=False)
    services.run_match(payload, semantic=False, reranker=True)
    assert dict(store.BUILDS) == builds  # nothing built or loaded again by the calls
    assert len(store._cache) == 2


def test_a_node_loads_only_the_parts_its_queues_use(tiny_source, monkeypatch):
    build(tiny_source)
    monkeypatch.setattr(signals, '_served', ['es2_knn'])
    signals.warm_indexes(sender='es2_knn@test')
    assert [name.rsplit('/', 1)[-1].split('-')[0] for name in store._cache] == ['semantic']
    store.clear_cache()
    monkeypatch.setattr(signals, '_served', ['api_heavy'])
    signals.warm_indexes(sender='api_heavy@test')
    # Reranked lexical calls: the semantic reranker reads the semantic index's vectors.
    assert [name.rsplit('/', 1)[-1].split('-')[0] for name in store._cache] == ['lexical', 'semantic']
    store.clear_cache()
    monkeypatch.setattr(services, 'reranker_name', lambda: 'fuzzy')
    signals.warm_indexes(sender='api_heavy@test')
    assert [name.rsplit('/', 1)[-1] for name in store._cache] == ['lexical-bm25']


def test_what_a_node_loaded_is_frozen_out_of_the_collectors_reach(tiny_source, monkeypatch):
    build(tiny_source)
    monkeypatch.setattr(signals, '_served', ['es2_knn'])
    gc.unfreeze()
    signals.warm_indexes(sender='es2_knn@test')
    index = next(iter(store._cache.values()))
    assert gc.get_freeze_count() > 0 and not any(obj is index for obj in gc.get_objects())


def test_the_semantic_index_is_loaded_with_its_projection_made(tiny_source, settings):
    settings.CONCEPTS_EMBEDDER = 'tfidf-svd'
    build(tiny_source)
    services.warm(lexical=False)
    embedder = next(iter(store._cache.values())).embedder
    assert embedder._projection is not None and embedder._projection.flags['C_CONTIGUOUS']


def test_a_failed_warm_start_leaves_the_worker_starting(db, monkeypatch, caplog):
    def broken(**kwargs):
        raise OSError('no space left on device')
    monkeypatch.setattr(services, 'warm', broken)
    monkeypatch.setattr(signals, '_served', ['interactive'])
    with caplog.at_level(logging.WARNING, logger='heavy_lanes'):
        signals.warm_indexes(sender='interactive@test')
    assert 'starts without its match indexes loaded: no space left on device' in caplog.text


def test_a_node_serving_no_lane_loads_nothing(tiny_source, monkeypatch):
    monkeypatch.setattr(signals, '_served', [])
    signals.warm_indexes(sender='maintenance@test')
    assert not store._cache
