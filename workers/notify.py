"""Tell waiting API requests that a call ended, through Redis pub/sub, with one subscriber per process.

The worker publishes on the call's channel (capacity.keys.notice_channel) when it records the end. In an
API process one daemon thread (the hub) holds one pub/sub connection pattern-subscribed to every call's
channel, and wakes the requests that wait on that call: a waiting request costs a thread and an Event,
not a Redis connection, so a host can hold many of them (docs/architecture.md, "Waiting").

A waiter registers its Event first, then reads the call's row, then waits: a call that ends between the two
is never missed. The row is the truth and the notice only a wake-up: a waiter also looks at the row every
POLL_SECONDS while the hub is connected (a notice lost in a reconnect costs at most that), and every
FALLBACK_POLL_SECONDS while it isn't. The periodic look while connected is shared (`wait_for(among=)`):
the first waiter due takes one look at the rows of every work this process waits on (`Hub.ended_lately`),
and only the waiters whose work it found ended read their own rows; so a host waiting on many calls reads
the database once every POLL_SECONDS for them all, not once per waiting request. The hub pings Redis every
PING_SECONDS and reconnects when nothing came back for STALE_SECONDS, so a connection left half-open by a
Redis failover doesn't go deaf for good.

A notice may carry the end itself: a call that succeeded is announced with its stored result (`state`, a
space and the answer's candidate count when it has one, a newline, the result's JSON text, when it is at
most NOTICE_RESULT_LIMIT bytes), so the request that waits for it answers without reading the row or the
result again (workers.lifecycle.reads.wait; the count is OCL's `num_returned` header). Only the code
that wrote the end (a guarded UPDATE that also shut out a later detach or cancel) may say so; every other
notice is a bare state and only a wake-up.

A request can register its watch before its call is published (`watch`, then `wait_for(..., watch=)`):
the call can't end before its watch, so the wait needn't read the row first (a notice, or the first
periodic look, finds the end).

A notice goes to one process only when it can (`reply_to`): the hub also subscribes to a channel of its own
(`Hub.own`: host, pid and a random part, so a forked or restarted process has a new one), and a request
that watches its work before publishing it names that channel in the work's message (NOTICE_HEADER, while
the hub is connected). The worker then announces the end of a work no other call joined there, as
`<work id>` and a newline before the notice (`notice(..., to=)`), instead of on the work's channel, which
every API process hears; so with P API processes a result is read once, not P times. Everything else keeps
the work's channel: a shared work's end, a cancel, a message that names no channel (an older API, a sweep's
new message), a notice no process heard (PUBLISH counted nobody: the process is gone), and a private notice
that found no watch in its process (its request stopped waiting; the hub sends it on bare, for a long poll
elsewhere).

The same connection carries the process's invalidations (capacity.keys.invalidation_channel): a message
there names a fact the process may keep (a token, a source's version: workers.local_cache) that changed.
The hub hands each to its `listeners`, and tells them when it is connected (subscribed to both) and when it
lost the connection, so a cache keeps nothing while a change could go unheard.

Written by hand because redis-py's pub/sub gives one connection per subscriber and no fan-out to many
waiting threads.
"""
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

import redis

from capacity.keys import invalidation_channel
from capacity.keys import notice_channel as channel
from capacity.keys import process_notice_channel
from common import connections
from common.process import PerProcess

logger = logging.getLogger('heavy_lanes')
POLL_SECONDS = 2.0
FALLBACK_POLL_SECONDS = 0.25
PING_SECONDS = 10.0
STALE_SECONDS = 30.0
RECONNECT_SECONDS = 1.0
NOTICE_RESULT_LIMIT = 1 << 20  # a larger result is announced bare: its waiter reads it from the database
NOTICE_HEADER = 'heavy_lanes_notice_to'  # the message header naming the process whose request waits (reply_to)


def get_client():
    return connections.connect('notices')


def publish(call_id, state, result=None, count=None):
    """Announce that a call reached `state` (with `result`, its stored JSON text, and `count`, its answer's
    candidates, when it succeeded and nothing can change that: see the module docstring); never raises
    (the waiter falls back to reading the row)."""
    try:
        get_client().publish(*notice(call_id, state, result, count))
    except redis.RedisError:
        pass


def notice(call_id, state, result=None, count=None, to=None):
    """(channel, message) of the notice that a call reached `state` (see `publish`), for a caller that
    sends it in a round trip of its own (the end of a run: capacity.store.release_and_end). `to`: the
    channel of the one process whose request waits for it (reply_to), else the call's own channel."""
    message = str(state)
    if result is not None and len(result) <= NOTICE_RESULT_LIMIT:
        message = f'{message} {int(count)}\n{result}' if count is not None else f'{message}\n{result}'
    return (to, f'{call_id}\n{message}') if to else (channel(call_id), message)


def reply_to(call_id):
    """This process's own notice channel when one of its requests watches `call_id` and its hub is
    connected (so it hears that channel), for the message of the call's work (NOTICE_HEADER); else None."""
    hub = _hubs.peek()
    if hub is None or not hub.connected.is_set():
        return None
    with hub.lock:
        return hub.own if call_id in hub.waiters else None


@dataclass(frozen=True)
class Notice:
    state: str
    result: str | None = None  # the stored result's JSON text, when the notice carries it
    count: int | None = None   # its answer's candidates (OCL's num_returned), when the notice carries them


def parse(data):
    text = data.decode() if isinstance(data, bytes) else str(data)
    head, newline, result = text.partition('\n')
    state, _, count = head.partition(' ')
    return Notice(state, result if newline else None, int(count) if count.isdigit() else None)


class Watch:
    """One waiting request's interest in one call: woken by each notice, which it keeps until taken."""

    def __init__(self, call_id):
        self.call_id = call_id
        self.event = threading.Event()
        self._notices = []
        self._lock = threading.Lock()

    def add(self, notice):
        with self._lock:
            self._notices.append(notice)
        self.event.set()

    def take(self):
        with self._lock:
            notices, self._notices = self._notices, []
        return notices


class Hub:
    """This process's one subscriber, and the requests waiting on each call."""

    def __init__(self):
        self.waiters = {}  # call id -> set of Watch
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.thread = None
        self.prefix = channel('')
        self.own = process_notice_channel(socket.gethostname(), os.getpid(), secrets.token_hex(4))
        self.heard = 0  # notices heard, on either channel (tests and the cost measure read it)
        self.stopping = threading.Event()  # set by `stop` (a process's own hub runs as long as it does)
        # The shared periodic look (ended_lately): when the last one started, and the works it found ended.
        self.look_lock = threading.Lock()
        self.looked_at = None
        self.looked_ended = frozenset()
        # Objects with connected(), lost() and invalidated(data) (workers.local_cache). They are told of each
        # change of state after `connected` changes, so one that reads `connected` never keeps a fact it
        # could miss the invalidation of.
        self.listeners = []

    def start(self):
        """Start the subscriber thread unless it runs (watch starts it too)."""
        with self.lock:
            self._start()

    def _start(self):
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self.run, name='heavy-lanes-notices', daemon=True)
            self.thread.start()

    def stop(self):
        """Let the subscriber thread end within a second (a test's second hub, standing for another process)."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(5)

    def listen_for_invalidations(self, listener):
        """Tell `listener` of every invalidation and of the connection's state, from now on; starts the hub."""
        with self.lock:
            if listener not in self.listeners:
                self.listeners.append(listener)
            self._start()

    def watch(self, call_id):
        """A Watch woken when `call_id`'s notices come; give it back with `unwatch`."""
        watch = Watch(call_id)
        with self.lock:
            self.waiters.setdefault(call_id, set()).add(watch)
            self._start()
        return watch

    def unwatch(self, watch):
        with self.lock:
            watches = self.waiters.get(watch.call_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self.waiters[watch.call_id]

    def waiting(self):
        with self.lock:
            return sum(len(events) for events in self.waiters.values())

    def ended_lately(self, among, within):
        """Of the works this process waits on, those that `among(ids)` (one look at all their rows) found
        ended, by a look started at most `within` s ago: made now, by this caller, when none was. A waiter
        that needs a look after this one started gets a newer one, so a lost notice costs at most `within`
        more than a look of its own would. `among`'s error is raised to the caller, as its own look's."""
        with self.look_lock:
            if self.looked_at is None or time.monotonic() - self.looked_at >= within:
                with self.lock:
                    ids = list(self.waiters)
                started = time.monotonic()
                self.looked_ended = frozenset(among(ids)) if ids else frozenset()
                self.looked_at = started
            return self.looked_ended

    def wake(self, call_id, notice=None):
        """Wake the watches of `call_id` with `notice`; whether there were any."""
        notice = notice or Notice('')
        with self.lock:
            watches = list(self.waiters.get(call_id, ()))
        for watch in watches:
            watch.add(notice)
        return bool(watches)

    def own_notice(self, data):
        """A notice on this process's own channel (`<work id>`, a newline, the notice): wake its watches, or
        when none is left (its request stopped waiting), send it on bare on the work's channel, where a long
        poll in another process hears it."""
        text = data.decode() if isinstance(data, bytes) else str(data)
        call_id, _, rest = text.partition('\n')
        found = parse(rest)
        if call_id and not self.wake(call_id, found):
            publish(call_id, found.state)

    def run(self):
        while not self.stopping.is_set():
            try:
                self.listen()
            except Exception as ex:  # noqa: BLE001 - the hub never dies: a closed socket raises ValueError too
                logger.warning('Completion notices lost their Redis connection (%s: %s); until it is back, waiting '
                               'requests read their calls every %s s and tokens and source versions are read '
                               'from the database every time', type(ex).__name__, ex, FALLBACK_POLL_SECONDS)
            self.connected.clear()
            self.tell('lost')
            time.sleep(RECONNECT_SECONDS)

    def tell(self, what, *args):
        """Call `what` on every invalidation listener; a listener's error is logged, never the hub's end."""
        for listener in list(self.listeners):
            try:
                getattr(listener, what)(*args)
            except Exception:  # noqa: BLE001 - one listener's bug must not deafen the waiting requests
                logger.exception('An invalidation listener failed in %s', what)

    def listen(self):
        pubsub = get_client().pubsub(ignore_subscribe_messages=False)
        try:
            # Subscribed in this order, the psubscribe's confirmation comes after the subscribes': once it
            # has come, every channel is heard (reply_to names `own` only then).
            pubsub.subscribe(invalidation_channel(), self.own)
            pubsub.psubscribe(self.prefix + '*')
            heard = pinged = time.monotonic()
            while not self.stopping.is_set():
                message = pubsub.get_message(timeout=1.0)
                now = time.monotonic()
                if message is not None:
                    heard = now
                    kind = message.get('type')
                    if kind == 'psubscribe':
                        self.connected.set()
                        self.tell('connected')
                    elif kind == 'message':
                        name = message['channel']
                        if (name.decode() if isinstance(name, bytes) else name) == self.own:
                            self.heard += 1
                            self.own_notice(message.get('data', b''))
                        else:
                            self.tell('invalidated', message.get('data', b''))
                    elif kind == 'pmessage':
                        self.heard += 1
                        name = message['channel']
                        name = name.decode() if isinstance(name, bytes) else name
                        self.wake(name[len(self.prefix):], parse(message.get('data', '')))
                if now - pinged >= PING_SECONDS:
                    pubsub.ping()
                    pinged = now
                if now - heard >= STALE_SECONDS:
                    raise redis.ConnectionError(f'no answer on the notice connection for {STALE_SECONDS} s')
        finally:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - its connection is gone already
                pass


_hubs = PerProcess(Hub)


def get_hub():
    return _hubs.get()


def wait_for(call_id, is_finished, timeout, watch=None, ended_by=None, among=None):
    """Wait up to `timeout` s until `is_finished()` is true; return its last value.

    `watch`: one the caller registered (`get_hub().watch`) before the call could end; it keeps and gives
    it back. The row isn't read before a notice or the first periodic look then.
    `ended_by(notice)`: True when a notice alone says the call ended (then the row isn't read).
    `among(ids)`: the ids whose works may have ended, of many, in one look: the periodic look of a
    connected hub is then shared by every waiter of the process (Hub.ended_lately), and `is_finished` runs
    only for a first look, after a notice, when the shared look found this one, or on a hub not connected."""
    if timeout <= 0:
        return is_finished()
    deadline = time.monotonic() + timeout
    hub = get_hub()
    own = watch is None
    watch = hub.watch(call_id) if own else watch
    look = own
    try:
        while True:
            if look and is_finished():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            connected = hub.connected.is_set()
            woken = watch.event.wait(min(left, POLL_SECONDS if connected else FALLBACK_POLL_SECONDS))
            watch.event.clear()
            notices = watch.take()
            if ended_by is not None and any(ended_by(notice) for notice in notices):
                return True
            look = woken or notices or among is None or not connected or \
                call_id in hub.ended_lately(among, POLL_SECONDS)
    finally:
        if own:
            hub.unwatch(watch)
