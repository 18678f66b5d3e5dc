"""A lane worker loads the match indexes before its pool forks (workers.signals.warm_indexes), so a pool
process's first call finds them in its cache."""
import logging

from concepts import services
from concepts.matching import store
from workers import signals


def test_warm_loads_nothing_it_would_have_to_build(tiny_source):
    builds = dict(store.BUILDS)
    assert services.warm() == 0 and not store._cache and dict(store.BUILDS) == builds


def build(source):
    store.lexical_index(source)
    store.semantic_index(source, services.embedder_name())
    store.clear_cache()


def test_warm_loads_every_sources_parts_into_the_cache(tiny_source):
    build(tiny_source)
    assert services.warm() == 2
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
    assert [name.rsplit('/', 1)[-1] for name in store._cache] == ['lexical-bm25']


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
