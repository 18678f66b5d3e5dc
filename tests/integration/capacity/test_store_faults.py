"""Real faults: a redis-server of our own stopped with SIGSTOP or restarted, a server that never answers,
a port nobody listens on. A call through the LaneStore must cost at most the deadline and take no lease late.
"""
import threading
import time
from unittest import mock

import pytest
import redis

from capacity.constants import Lane
from capacity.keys import lane_key
from capacity.operations import LATE_ACQUIRE, Acquired
from capacity.store import get_store
from tests.integration.workers.conftest import wait_until

pytestmark = pytest.mark.slow

LEASE_MS = 60_000
SLACK = 0.3  # scheduling noise on a busy 2-core machine


@pytest.fixture
def deadline(settings):
    """A deadline of 0.2 s under a socket timeout of 5 s, so only the deadline can end a hung call."""
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 0.2
    settings.CAPACITY_REDIS_TIMEOUT_SECONDS = 5
    return 0.2


def timed(function, *args, **kwargs):
    started = time.monotonic()
    try:
        function(*args, **kwargs)
    except redis.RedisError as ex:
        return ex, time.monotonic() - started
    pytest.fail(f'{function.__name__} returned instead of failing')


def test_a_stopped_redis_costs_a_call_at_most_the_deadline(own_redis, lanes_at, deadline):
    lanes_at(own_redis.port)
    key = lane_key(Lane.API_HEAVY)
    assert get_store().count([key]) == [0]  # connected, scripts loaded
    own_redis.pause()
    try:
        error, elapsed = timed(get_store().ops.acquire, [key], [4], 'call-1', LEASE_MS, force=False)
    finally:
        own_redis.resume()
    assert isinstance(error, redis.TimeoutError)
    assert str(error) == 'no answer from Redis within 0.2 s'
    assert elapsed < deadline + SLACK


def test_acquires_in_a_hang_cost_the_deadline_and_leave_no_lease_when_redis_runs_them_late(
        own_redis, lanes_at, deadline, settings):
    """Redis may run an acquire from its input buffer after the caller gave up: one past its not-after
    guard takes nothing; one within it may take leases, which the release the gate defers for every
    unanswered acquire (capacity.releases) removes once Redis answers again."""
    client = lanes_at(own_redis.port)
    key = lane_key(Lane.API_HEAVY)
    assert get_store().count([key]) == [0]
    own_redis.pause()
    try:
        # The first says Redis must not run it 100 ms from now; Redis wakes up later than that.
        first, elapsed_first = timed(get_store().ops.acquire, [key], [4], 'first', LEASE_MS, force=True,
                                     not_after_ms=int(time.time() * 1000) + 100)
        # The second keeps the default guard (deadline + 2 s): whether it reaches Redis depends on the
        # moment (its connection's handshake waits too); if it does, it leases. The gate defers its release.
        second, elapsed_second = timed(get_store().ops.acquire, [key], [4], 'second', LEASE_MS, force=True)
        get_store().releases.defer([key], 'second')
    finally:
        own_redis.resume()
    assert isinstance(first, redis.TimeoutError) and isinstance(second, redis.TimeoutError)
    assert elapsed_first < deadline + SLACK and elapsed_second < deadline + SLACK

    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 5
    assert get_store().runner.call(lambda: 'drained') == 'drained'  # the thread got past the second's connect
    wait_until(lambda: not get_store().releases.pending(), timeout=10, message='the deferred release')
    assert client.zscore(key, 'first') is None  # run late past its guard: it refused itself
    assert client.zcard(key) == 0               # and whatever the second took was given back
    # Redis is back: the next acquire works on the same client.
    assert get_store().acquire([key], [4], 'third', LEASE_MS, force=False) == Acquired(True, (0,))
    with pytest.raises(redis.TimeoutError, match=LATE_ACQUIRE):
        get_store().ops.acquire([key], [4], 'fourth', LEASE_MS, force=True, not_after_ms=1)


def test_a_server_that_never_answers_costs_a_call_at_most_the_deadline(silent_server, lanes_at, deadline):
    lanes_at(silent_server.port)
    error, elapsed = timed(get_store().ops.count, [lane_key(Lane.API_HEAVY)])
    assert str(error) == 'no answer from Redis within 0.2 s'
    assert elapsed < deadline + SLACK
    assert silent_server.accepted.is_set()  # the hang was after the TCP handshake


def test_a_socket_timeout_is_not_retried(silent_server, lanes_at, settings):
    """With the socket timeout under the deadline, redis-py's own timeout ends the call, once."""
    settings.CAPACITY_REDIS_TIMEOUT_SECONDS = 0.3
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 3
    lanes_at(silent_server.port)
    error, elapsed = timed(get_store().ops.count, [lane_key(Lane.API_HEAVY)])
    assert isinstance(error, redis.TimeoutError)
    assert 'no answer from Redis' not in str(error)
    assert 0.3 <= elapsed < 0.55  # a retry would take another 0.3 s


def test_a_sentinel_that_never_answers_costs_a_call_at_most_the_deadline(silent_server, lanes_at, deadline):
    lanes_at(silent_server.port, sentinels=True)
    key = lane_key(Lane.API_HEAVY)
    error, elapsed = timed(get_store().ops.acquire, [key], [4], 'call-1', LEASE_MS, force=False)
    assert str(error) == 'no answer from Redis within 0.2 s'
    assert elapsed < deadline + SLACK


def test_a_port_nobody_listens_on_fails_at_once(lanes_at, deadline):
    from devstack.processes import free_port

    lanes_at(free_port())
    error, elapsed = timed(get_store().ops.count, [lane_key(Lane.API_HEAVY)])
    assert isinstance(error, redis.ConnectionError)
    assert elapsed < deadline


def test_after_a_redis_restart_the_scripts_are_loaded_again(own_redis, lanes_at, settings):
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 2
    client = lanes_at(own_redis.port)
    key = lane_key(Lane.API_HEAVY)
    assert get_store().acquire([key], [4], 'before', LEASE_MS, force=False) == Acquired(True, (0,))
    own_redis.stop()
    own_redis.start()  # same port, empty: no keys, no scripts
    assert not client.script_exists(get_store().ops.script('acquire').sha)[0]
    assert get_store().acquire([key], [4], 'after', LEASE_MS, force=False) == Acquired(True, (0,))
    assert client.script_exists(get_store().ops.script('acquire').sha)[0]


def test_a_dns_lookup_that_never_returns_costs_the_deadline_until_the_probe_finds_no_answer(
        lanes_at, deadline, settings, monkeypatch, make_user, db):
    """Connecting is what no socket timeout bounds: a name lookup that hangs (here: getaddrinfo blocked for
    one host name) costs the first call the deadline. Nothing was sent, which a starved process meets too, so
    the probe is asked; it gets no answer either and opens the skip window, which spares the next calls."""
    import socket

    from capacity import gate
    from capacity.constants import Decision
    released = threading.Event()
    real = socket.getaddrinfo

    def hanging(host, *args, **kwargs):
        if host == 'redis.hangs.example':
            released.wait(30)
            raise socket.gaierror('lookup gave up')
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, 'getaddrinfo', hanging)
    settings.CAPACITY_REDIS_RETRY_SECONDS = 15
    lanes_at(6379)
    settings.REDIS_HOST = 'redis.hangs.example'
    from capacity.store import LaneStore, build_redis_client, use_store
    use_store(LaneStore(build_redis_client()))
    user = make_user()
    try:
        started = time.monotonic()
        first = gate.admit(user, rows=1, semantic=True)
        first_seconds = time.monotonic() - started
        wait_until(lambda: not get_store().is_available(), timeout=deadline * 2 + SLACK,
                   message="the probe's verdict")
        started = time.monotonic()
        second = gate.admit(user, rows=1, semantic=True)
        second_seconds = time.monotonic() - started
    finally:
        released.set()
    assert first.decision == Decision.UNAVAILABLE and first_seconds < deadline + SLACK
    assert second.decision == Decision.UNAVAILABLE and second_seconds < 0.05  # skipped: no Redis call


def stop_this_process(after, seconds):
    """SIGSTOP this process `after` s from now for `seconds` s, from a shell of its own (not stopped with it):
    no thread of this process runs meanwhile, as on a host that gives it no CPU."""
    import os
    import subprocess
    return subprocess.Popen(['sh', '-c', f'sleep {after}; kill -STOP {os.getpid()}; sleep {seconds}; '
                                         f'kill -CONT {os.getpid()}'])


@pytest.mark.parametrize('connection', ['new', 'established'])
def test_an_answer_that_waited_in_the_socket_while_the_process_got_no_cpu_counts(
        own_redis, lanes_at, settings, connection):
    """Redis answers an acquire within 0.4 s, but the process that sent it is stopped from 0.15 s to 1.15 s,
    past its 0.5 s deadline. When it runs again the answer is in its socket: the lease is taken and counted,
    the call is not failed open, and the skip window stays shut. `new`: the acquire goes out on the Redis
    thread over a connection made for it (where the caller used to give up at the deadline); `established`:
    on the caller's own thread."""
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 0.5
    settings.CAPACITY_REDIS_TIMEOUT_SECONDS = 1.0
    client = lanes_at(own_redis.port)
    key = lane_key(Lane.API_HEAVY)
    store = get_store()
    if connection == 'established':
        assert store.acquire([key], [4], 'warm', LEASE_MS, force=False) == Acquired(True, (0,))
        assert store.runner._ready  # the next operation runs on this thread
    else:
        client.ping()  # the pool holds a connection, so what the Redis thread does is send, not connect
        assert not store.runner._ready
    pauser = redis.Redis(port=own_redis.port)
    before = client.zcard(key)
    pauser.execute_command('CLIENT', 'PAUSE', 400, 'ALL')  # Redis answers 0.4 s from now
    stopper = stop_this_process(0.15, 1.0)
    try:
        started = time.monotonic()
        acquired = store.acquire([key], [4], 'starved', LEASE_MS, force=False)
        elapsed = time.monotonic() - started
    finally:
        stopper.wait(10)
        pauser.close()
    assert elapsed > 1.0  # the process was stopped past its deadline while the call waited
    assert acquired == Acquired(True, (before,))
    assert client.zscore(key, 'starved') is not None
    assert store.is_available() and store.releases.pending() == {}


def test_a_deadline_met_before_sending_opens_the_skip_window_only_if_the_probe_gets_no_answer(
        own_redis, lanes_at, deadline):
    """An acquire whose deadline passes before it is sent (its process is behind) says nothing about Redis:
    the probe asks at once, Redis answers it, and the window stays shut; the next call is counted."""
    from capacity.runner import Unsent
    lanes_at(own_redis.port)
    key = lane_key(Lane.API_HEAVY)
    store = get_store()
    assert store.acquire([key], [4], 'first', LEASE_MS, force=False) == Acquired(True, (0,))
    with mock.patch.object(store.ops, 'acquire', side_effect=Unsent('no answer from Redis within 0.2 s')):
        assert not store.acquire([key], [4], 'behind', LEASE_MS, force=False)
    wait_until(lambda: store.prober.thread is None and store.prober.probes == 1, timeout=5,
               message='the probe to answer')
    assert store.is_available()
    assert store.acquire([key], [4], 'next', LEASE_MS, force=False) == Acquired(True, (1,))
