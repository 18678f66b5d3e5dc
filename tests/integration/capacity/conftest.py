"""Fixtures for gate tests: the lane store on each backend, a fresh config cache, captured log lines."""
import pytest

from capacity.config import clear_cache, save_config
from capacity import gate
from capacity.caller import RequestFacts, is_aware
from capacity.store import LaneStore, use_store


@pytest.fixture
def lanes(redis_client, db):
    """A LaneStore on this test's backend (fakeredis or the real Redis) with the default config."""
    use_store(LaneStore(redis_client))
    clear_cache()
    yield redis_client
    use_store(None)
    clear_cache()


@pytest.fixture(autouse=True)
def config_lines(monkeypatch):
    """The ocl_capacity_config lines, captured instead of written; a cold cache before and after."""
    lines = []
    monkeypatch.setattr('capacity.config.emit', lines.append)
    clear_cache()
    yield lines
    clear_cache()


@pytest.fixture
def configure(config_lines):
    def configure(**changes):
        save_config(changes)
    return configure


@pytest.fixture
def gates():
    """acquire(user, ...) -> the Admission of one call; every admission's leases are released at teardown.

    `queue` names a queue of workers.lanes (its lane is the one its waiting room extends); `metadata` is the
    X-OCL-Event-Metadata object.
    """
    from workers.lanes import get_queue
    made = []

    def acquire(user, endpoint='$match', rows=10, semantic=True, reranker=False, metadata=None, queue='', **call):
        facts = call.pop('facts', None) or RequestFacts(aware=is_aware(metadata or {}))
        draws_on = get_queue(queue).draws_on if queue else None
        admission = gate.admit(user, endpoint=endpoint, rows=rows, semantic=semantic, reranker=reranker,
                               queue=queue, draws_on=draws_on, facts=facts, **call)
        made.append(admission)
        return admission
    yield acquire
    for admission in made:
        gate.release(admission)
