"""Completion notices: one subscriber per process wakes every request waiting on a call, and a wait that
hears nothing still ends when the row says so or at its timeout."""
import threading
import time
import uuid

import pytest

from workers import notify

pytestmark = pytest.mark.redis


def later(seconds, function, *args):
    timer = threading.Timer(seconds, function, args)
    timer.start()
    return timer


def test_a_notice_wakes_the_waiters_of_its_call_only():
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    done = set()

    def finish(call_id):
        done.add(call_id)
        notify.publish(call_id, 'succeeded')
    later(0.3, finish, first)
    started = time.monotonic()
    assert notify.wait_for(first, lambda: first in done, 5)
    assert time.monotonic() - started < notify.POLL_SECONDS  # woken by the notice, not by a poll
    notify.publish(first, 'succeeded')  # a late notice of the first call must not end the second wait
    later(0.3, finish, second)
    started = time.monotonic()
    assert notify.wait_for(second, lambda: second in done, 5)
    assert 0.25 < time.monotonic() - started < notify.POLL_SECONDS
    assert notify.wait_for(uuid.uuid4().hex, lambda: False, 0.2) is False  # a wait that times out says so
    assert notify.get_hub().waiting() == 0


def test_many_waiters_share_one_subscriber():
    calls = [uuid.uuid4().hex for _ in range(50)]
    done, woken = set(), []
    before = {thread.name for thread in threading.enumerate()}

    def wait(call_id):
        if notify.wait_for(call_id, lambda: call_id in done, 10):
            woken.append(time.monotonic())
    threads = [threading.Thread(target=wait, args=(call_id,)) for call_id in calls]
    for thread in threads:
        thread.start()
    notify.get_hub().connected.wait(5)
    time.sleep(0.2)
    assert notify.get_hub().waiting() == 50
    finished_at = time.monotonic()
    for call_id in calls:
        done.add(call_id)
        notify.publish(call_id, 'succeeded')
    for thread in threads:
        thread.join(10)
    assert len(woken) == 50 and max(woken) - finished_at < 1.5
    hubs = [thread for thread in threading.enumerate() if thread.name == 'heavy-lanes-notices']
    assert len(hubs) == 1 and 'heavy-lanes-notices' in before | {hubs[0].name}


def test_a_wait_reads_the_row_when_no_notice_comes(monkeypatch):
    monkeypatch.setattr(notify, 'POLL_SECONDS', 0.2)
    done = []
    later(0.3, done.append, True)  # the call ends, and nobody publishes
    started = time.monotonic()
    assert notify.wait_for(uuid.uuid4().hex, lambda: bool(done), 5)
    assert time.monotonic() - started < 1.0


def test_the_hub_outlives_a_connection_closed_under_it(monkeypatch):
    """A pub/sub connection closed by another thread (connections.forget) raises ValueError, not a Redis
    error, in the hub's read: the hub reconnects instead of dying."""
    hub = notify.Hub()
    listen, failures = hub.listen, []

    def closed_once():
        if not failures:
            failures.append(1)
            raise ValueError('I/O operation on closed file.')
        return listen()
    monkeypatch.setattr(hub, 'listen', closed_once)
    monkeypatch.setattr(notify, 'RECONNECT_SECONDS', 0.05)
    watch = hub.watch('x')
    assert hub.connected.wait(5) and failures and hub.thread.is_alive()
    hub.unwatch(watch)


def test_a_notice_can_carry_the_result_and_a_watch_made_before_the_publish_needs_no_first_look():
    call_id = uuid.uuid4().hex
    looks, heard = [], []
    hub = notify.get_hub()
    hub.unwatch(hub.watch('warm-up'))  # starts the hub
    assert hub.connected.wait(5)
    with_result = '[{"row": {"name": "x"}, "results": []}]'

    def ended_by(notice):
        heard.append(notice)
        return notice.state == 'succeeded' and notice.result is not None
    watch = hub.watch(call_id)
    try:
        later(0.2, notify.publish, call_id, 'running?')  # a bare notice: only a wake-up, the row is read
        later(0.4, notify.publish, call_id, 'succeeded', with_result)
        started = time.monotonic()
        assert notify.wait_for(call_id, lambda: looks.append(1) and False, 5, watch=watch, ended_by=ended_by)
        assert time.monotonic() - started < notify.POLL_SECONDS
    finally:
        hub.unwatch(watch)
    assert len(looks) == 1  # after the bare notice; none before it, none after the one with the result
    assert heard == [notify.Notice('running?'), notify.Notice('succeeded', with_result)]


def test_a_result_too_large_for_a_notice_is_announced_bare(monkeypatch):
    monkeypatch.setattr(notify, 'NOTICE_RESULT_LIMIT', 10)
    call_id, heard = uuid.uuid4().hex, []
    done = []
    later(0.2, notify.publish, call_id, 'succeeded', '[' + '1,' * 20 + '1]')
    later(0.3, done.append, 1)
    assert notify.wait_for(call_id, lambda: bool(done), 5, ended_by=lambda notice: heard.append(notice))
    assert heard[0] == notify.Notice('succeeded')


def test_a_watch_made_before_the_publish_on_a_hub_not_connected_finds_the_end_by_its_fallback_look(
        monkeypatch):
    hub = notify.Hub()
    monkeypatch.setattr(notify, 'get_hub', lambda: hub)
    monkeypatch.setattr(hub, 'run', lambda: None)  # never connects
    watch, looks = hub.watch('y'), []
    started = time.monotonic()
    assert notify.wait_for('y', lambda: looks.append(1) or True, 5, watch=watch)
    assert notify.FALLBACK_POLL_SECONDS <= time.monotonic() - started < notify.POLL_SECONDS and looks == [1]
    hub.unwatch(watch)


def test_a_notice_with_a_result_carries_its_count_and_one_without_still_parses():
    """The count (OCL's num_returned) goes with the result; a bare notice has neither, and a notice from a
    worker of the version before (no count) still brings its result."""
    assert notify.parse(notify.notice('c1', 'succeeded', '[1]', 3)[1].encode()) == notify.Notice('succeeded', '[1]', 3)
    assert notify.parse(notify.notice('c1', 'succeeded', '[1]')[1]) == notify.Notice('succeeded', '[1]')
    assert notify.parse(b'succeeded\n[{"a": "b c"}]') == notify.Notice('succeeded', '[{"a": "b c"}]')
    assert notify.notice('c1', 'cancelled', None, 3)[1] == 'cancelled'
    assert notify.parse(b'cancelled') == notify.Notice('cancelled')


def test_waiters_with_a_shared_look_read_the_rows_once_a_poll_for_all_of_them(monkeypatch):
    """No notice comes: the periodic look of a connected hub is one `among` for every waiter of the process,
    and only the waiters whose work it found ended read their own rows."""
    monkeypatch.setattr(notify, 'POLL_SECONDS', 0.2)
    hub = notify.get_hub()
    hub.unwatch(hub.watch('warm-up'))
    assert hub.connected.wait(5)
    calls = [uuid.uuid4().hex for _ in range(20)]
    done, shared_looks, own_looks, results = set(), [], [], {}
    lock = threading.Lock()

    def among(ids):
        with lock:
            shared_looks.append(set(ids))
        return {call_id for call_id in ids if call_id in done}

    def wait(call_id):
        def finished():
            with lock:
                own_looks.append(call_id)
            return call_id in done
        results[call_id] = notify.wait_for(call_id, finished, 1.5, watch=watches[call_id], among=among)
    watches = {call_id: hub.watch(call_id) for call_id in calls}  # as a request watching before its publish
    threads = [threading.Thread(target=wait, args=(call_id,)) for call_id in calls]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    later(0.5, done.update, calls[:5])  # five end, and nobody publishes
    for thread in threads:
        thread.join(5)
    for watch in watches.values():
        hub.unwatch(watch)
    took = time.monotonic() - started
    assert [results[call_id] for call_id in calls] == [True] * 5 + [False] * 15
    # one shared look a poll (the first waiter due makes it, the others use it), not one a waiter a poll
    assert 3 <= len(shared_looks) <= took / 0.2 + 2 and all(set(calls) <= ids for ids in shared_looks[:2])
    assert sorted(set(own_looks)) == sorted(calls[:5])  # the others never read their own rows
    assert len(own_looks) == 5


def test_a_shared_look_that_fails_fails_the_wait_as_its_own_look_would(monkeypatch):
    monkeypatch.setattr(notify, 'POLL_SECONDS', 0.1)
    hub = notify.get_hub()
    hub.unwatch(hub.watch('warm-up'))
    assert hub.connected.wait(5)
    call_id = uuid.uuid4().hex

    def among(ids):
        raise RuntimeError('the database is down')
    watch = hub.watch(call_id)
    try:
        with pytest.raises(RuntimeError, match='database is down'):
            notify.wait_for(call_id, lambda: False, 2, watch=watch, among=among)
    finally:
        hub.unwatch(watch)


def test_a_notice_for_this_process_wakes_its_watch_and_one_no_watch_waits_for_goes_on_bare_to_every_process():
    """reply_to names the process's own channel only for a call it watches, on a connected hub; a notice
    there wakes that watch with its result; one whose watch is gone (its request stopped waiting) is sent on
    bare on the call's channel, where another process's long poll hears it."""
    call_id, left = uuid.uuid4().hex, uuid.uuid4().hex
    hub, other = notify.get_hub(), notify.Hub()
    hub.unwatch(hub.watch('warm-up'))
    assert hub.connected.wait(5)
    assert notify.reply_to(call_id) is None  # nobody here waits for it
    watch = hub.watch(call_id)
    try:
        assert notify.reply_to(call_id) == hub.own and not hub.own.startswith(hub.prefix)
        notify.get_client().publish(*notify.notice(call_id, 'succeeded', '[]', 0, to=notify.reply_to(call_id)))
        assert watch.event.wait(5) and watch.take() == [notify.Notice('succeeded', '[]', 0)]
    finally:
        hub.unwatch(watch)
    elsewhere = other.watch(left)  # a long poll in another process
    try:
        assert other.connected.wait(5)
        notify.get_client().publish(*notify.notice(left, 'succeeded', '[]', 0, to=hub.own))
        assert elsewhere.event.wait(5) and elsewhere.take() == [notify.Notice('succeeded')]
    finally:
        other.unwatch(elsewhere)
        other.stop()
