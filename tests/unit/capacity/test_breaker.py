"""The probe that closes the skip window (capacity.breaker), on fakeredis: it closes the window once Redis
answers, never while it doesn't, runs at most one thread per process, and is off at 0."""
import time

import fakeredis
import pytest

from capacity.store import LaneStore, use_store


@pytest.fixture
def store(settings):
    settings.CAPACITY_REDIS_RETRY_SECONDS = 15
    settings.CAPACITY_REDIS_PROBE_SECONDS = 0.02
    server = fakeredis.FakeServer()
    store = use_store(LaneStore(fakeredis.FakeRedis(server=server)))
    store.server = server
    yield store
    store.server.connected = True
    wait(lambda: not probes_running(store))  # no probe of this test's runs on into the next one
    use_store(None)


def probes_running(store):
    """This store's probe threads alive. Only its own: a store another test left in this process (an xdist
    worker runs many files) may probe its own Redis now, under the same thread name."""
    thread = store.prober.thread
    return [thread] if thread is not None and thread.is_alive() else []


def wait(predicate, seconds=10):
    """Until `predicate()`; the bound is for a machine whose cores other runs keep busy (a CI run at load 5–9
    waited out the 3 s this bound was, twenty 20 ms probes in), not a measure of the probe's speed."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_window_closes_once_redis_answers_and_the_probe_stops(store):
    store.server.connected = False
    store.mark_unavailable()
    wait(lambda: store.prober.probes >= 3)  # several probes, each refused (a fixed 0.2 s saw one under CI load)
    assert not store.is_available()
    store.server.connected = True
    wait(store.is_available)
    wait(lambda: not probes_running(store))


def test_one_probe_at_a_time_however_many_errors_open_the_window(store):
    store.server.connected = False
    for _ in range(50):
        store.mark_unavailable()
    assert len(probes_running(store)) == 1 and store.prober.started == 1
    store.server.connected = True
    wait(lambda: not probes_running(store))
    store.server.connected = False
    store.mark_unavailable()  # a new error after the close starts a new probe
    assert len(probes_running(store)) == 1 and store.prober.started == 2
    store.server.connected = True
    wait(store.is_available)


def test_a_window_reopened_as_the_probe_ends_gets_a_probe(store):
    # The probe's decision to stop is taken under its lock: an error from then on starts another one.
    for _ in range(20):
        store.mark_unavailable()
        wait(store.is_available)
        store.mark_unavailable()
        wait(store.is_available)
    wait(lambda: not probes_running(store))


def test_no_probe_at_zero_the_window_runs_its_length(store, settings):
    settings.CAPACITY_REDIS_PROBE_SECONDS = 0
    store.mark_unavailable()
    time.sleep(0.1)
    assert not store.is_available() and not probes_running(store) and store.prober.probes == 0
    settings.CAPACITY_REDIS_RETRY_SECONDS = 0.05
    store.mark_unavailable()
    time.sleep(0.06)
    assert store.is_available()
