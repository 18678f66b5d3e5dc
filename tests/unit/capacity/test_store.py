"""A LaneStore: its process state, its deadline and the fail-open rule of its verbs, with plain Python
operations standing in for Redis.

Real hangs (a SIGSTOPped redis-server, a server that never answers) are in
tests/integration/capacity/test_store_faults.py.
"""
import os
import threading
import time
from unittest import mock

import fakeredis
import pytest
import redis

from capacity.runner import Unsent
from capacity.store import LaneStore, get_store, use_store
from capacity.threads import MAX_QUEUED, Busy


@pytest.fixture(autouse=True)
def fresh_lanes():
    store = use_store(None)
    yield store
    use_store(None)


@pytest.fixture
def gate():
    """An event that hung operations wait on; set at teardown so no test leaves a job blocked."""
    event = threading.Event()
    yield event
    event.set()


def test_a_call_returns_what_the_operation_returns_and_runs_it_on_the_redis_thread():
    assert get_store().runner.call(lambda a, b: (a + b, threading.current_thread().name), 2, 3) == (
        5, 'ocl-capacity-redis')


def test_a_call_that_hangs_fails_at_the_deadline(settings, gate):
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 0.1
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError) as error:
        get_store().runner.call(gate.wait)
    elapsed = time.monotonic() - started
    assert str(error.value) == 'no answer from Redis within 0.1 s'
    assert 0.1 <= elapsed < 0.3


def test_a_call_queued_behind_a_hung_one_times_out_and_never_runs(settings, gate):
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 0.05
    ran = []
    with pytest.raises(redis.TimeoutError):
        get_store().runner.call(gate.wait)
    with pytest.raises(redis.TimeoutError):
        get_store().runner.call(ran.append, 'second')
    gate.set()
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 2
    assert get_store().runner.call(ran.append, 'third') is None  # the thread has got past the second job
    assert ran == ['third']


def test_an_operations_own_errors_reach_the_caller_unchanged(settings):
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 1

    def fail(error):
        raise error

    with pytest.raises(redis.ConnectionError, match='refused'):
        get_store().runner.call(fail, redis.ConnectionError('refused'))
    # A socket timeout is a builtin TimeoutError, the same class a job's wait raises at its timeout:
    # it must not be reported as the deadline.
    with pytest.raises(TimeoutError, match='socket read'):
        get_store().runner.call(fail, TimeoutError('socket read'))


def test_a_busy_redis_thread_refuses_a_call_at_once(settings, gate):
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 5
    thread = get_store().runner.thread
    running = threading.Event()
    thread.submit(lambda: (running.set(), gate.wait()))
    assert running.wait(2)
    for _ in range(MAX_QUEUED):
        thread.submit(gate.wait)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match='busy'):
        get_store().runner.call(int)
    assert time.monotonic() - started < 0.1


def test_a_redis_error_opens_the_skip_window_for_the_retry_time(settings):
    settings.CAPACITY_REDIS_RETRY_SECONDS = 15
    assert get_store().is_available()
    get_store().mark_unavailable()
    assert not get_store().is_available()
    assert 14 < get_store().unavailable_until - time.monotonic() <= 15
    settings.CAPACITY_REDIS_RETRY_SECONDS = 0.05
    get_store().mark_unavailable()
    time.sleep(0.06)
    assert get_store().is_available()


def test_each_store_has_its_own_process_state(settings):
    settings.CAPACITY_REDIS_RETRY_SECONDS = 15
    first, second = fakeredis.FakeRedis(), fakeredis.FakeRedis()
    store = use_store(LaneStore(first))
    script = store.ops.script('count')
    thread = store.runner.thread
    store.mark_unavailable()
    other = use_store(LaneStore(second))
    assert get_store() is other and other.runner.client is second
    assert other.is_available()
    assert other.runner.thread is not thread
    assert other.ops.script('count') is not script
    assert other.ops.script('count') is other.ops.script('count')


def test_the_client_is_built_once_from_settings(settings):
    settings.REDIS_SENTINELS = False
    settings.REDIS_HOST, settings.REDIS_PORT = 'redis.example', 6390
    clients = []
    threads = [threading.Thread(target=lambda: clients.append(get_store().runner.client)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(client) for client in clients}) == 1
    assert clients[0].connection_pool.connection_kwargs['port'] == 6390


def test_a_forked_process_gets_its_own_redis_thread(settings):
    """gunicorn forks workers: a child inherits the parent's thread object, but not the running thread."""
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = 2
    parent_thread = get_store().runner.thread
    assert get_store().runner.call(os.getpid) == os.getpid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe and leave without running pytest's teardown
        code = 1
        try:
            child_thread = get_store().runner.thread
            answer = get_store().runner.call(os.getpid)
            os.write(write_end, f'{child_thread is not parent_thread} {answer == os.getpid()}'.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, 'rb') as pipe:
            report = pipe.read().decode()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == 'True True'
    assert get_store().runner.thread is parent_thread


# The fail-open rule, applied once per verb (capacity.store.verb).


@pytest.fixture
def faked():
    store = use_store(LaneStore(fakeredis.FakeRedis(server=fakeredis.FakeServer())))
    yield store
    store.releases.clear()


@pytest.mark.parametrize('verb, args', [
    ('acquire', (['k'], [1], 't', 1000, False)),
    ('renew', (['k'], 't', 1000)),
    ('release', (['k'], 't')),
    ('count', (['k'],)),
    ('claim', ('k', 't', 1000)),
    ('read', ('k',)),
    ('holds', ()),
])
def test_a_verb_in_the_skip_window_sends_nothing_and_says_it_skipped(faked, verb, args):
    from capacity.store import SKIPPED
    faked.mark_unavailable()
    with mock.patch.object(faked, 'ops') as ops:
        assert getattr(faked, verb)(*args) == SKIPPED
    assert not ops.mock_calls


@pytest.mark.parametrize('error, window_opens', [
    (redis.ConnectionError('gone'), True),      # Redis's: skip it for a while
    (redis.ResponseError('WRONGTYPE'), True),   # Redis answered with an error: still Redis's
    (RuntimeError('a bug'), False),             # not Redis: the window stays shut, the call still goes on
])
def test_a_verb_that_fails_returns_unknown_with_the_error(faked, error, window_opens, caplog):
    from capacity.store import Unknown
    with mock.patch.object(faked.ops, 'count', side_effect=error):
        answer = faked.count(['k'])
    assert answer == Unknown(f'{type(error).__name__}: {error}') and not answer
    assert faked.is_available() is not window_opens
    assert [record.getMessage() for record in caplog.records] == [
        f'Capacity count failed open ({type(error).__name__}: {error})']


def test_a_call_that_makes_no_sense_is_raised_not_hidden(faked):
    from capacity.operations import BadCall
    with pytest.raises(BadCall):
        faked.acquire([], [], 't', 1000, False)
    assert faked.is_available()


@pytest.mark.parametrize('verb, args, error, deferred', [
    ('acquire', (['k'], [1], 't', 1000, False), redis.TimeoutError('slow'), True),   # Redis may still run it
    ('acquire', (['k'], [1], 't', 1000, False), redis.ConnectionError('cut'), True),
    ('acquire', (['k'], [1], 't', 1000, False), redis.ResponseError('refused'), False),  # it didn't run
    ('release', (['k'], 't'), redis.ResponseError('refused'), True),                  # a release is never lost
    ('release', (['k'], 't'), None, True),                                            # the skip window too
])
def test_what_a_failed_verb_may_have_left_behind_is_released_later(faked, verb, args, error, deferred):
    if error is None:
        faked.mark_unavailable()
        getattr(faked, verb)(*args)
    else:
        with mock.patch.object(faked.ops, verb, side_effect=error):
            getattr(faked, verb)(*args)
    assert faked.releases.pending() == ({'t': ['k']} if deferred else {})


def test_a_probe_asks_redis_in_the_skip_window_and_an_answer_closes_it(faked):
    faked.mark_unavailable()
    assert faked.probe() is True and faked.is_available()
    with mock.patch.object(faked.ops, 'ping', side_effect=redis.ConnectionError('gone')):
        answer = faked.probe()
    assert not answer and answer.error == 'ConnectionError: gone'


def wait_for_the_probe(store, timeout=5):
    deadline = time.monotonic() + timeout
    while store.prober.thread is not None:
        assert time.monotonic() < deadline, 'the probe did not end'
        time.sleep(0.01)


@pytest.mark.parametrize('error', [
    Unsent('no answer from Redis within 1.0 s'),  # the deadline passed before it was sent: a process behind
    Busy('the capacity Redis thread is busy'),     # its own Redis thread's queue was full
])
def test_an_error_a_busy_process_meets_opens_the_window_only_if_the_probe_gets_no_answer(faked, error):
    with mock.patch.object(faked.ops, 'count', side_effect=error):
        assert not faked.count(['k'])
    wait_for_the_probe(faked)
    assert faked.is_available() and faked.prober.probes == 1  # Redis answered the probe

    with mock.patch.object(faked.ops, 'count', side_effect=error), \
            mock.patch.object(faked.ops, 'ping', side_effect=redis.TimeoutError('Timeout reading from socket')):
        assert not faked.count(['k'])
        wait_for_the_probe(faked)
    assert not faked.is_available() and faked.prober.probes == 2  # it didn't: Redis is skipped
