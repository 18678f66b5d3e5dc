"""Tell waiting API requests that a call ended, through Redis pub/sub, with one subscriber per process.

The worker publishes on the call's channel (capacity.keys.notice_channel) when it records the end. In an
API process one daemon thread (the hub) holds one pub/sub connection pattern-subscribed to every call's
channel, and wakes the requests that wait on that call: a waiting request costs a thread and an Event,
not a Redis connection, so a host can hold many of them (docs/architecture.md, "Waiting").

A waiter registers its Event first, then reads the call's row, then waits: a call that ends between the two
is never missed. The row is the truth and the notice only a wake-up: a waiter also looks at the row every
POLL_SECONDS while the hub is connected (a notice lost in a reconnect costs at most that), and every
FALLBACK_POLL_SECONDS while it isn't. The hub pings Redis every PING_SECONDS and reconnects when nothing came
back for STALE_SECONDS, so a connection left half-open by a Redis failover doesn't go deaf for good.

Written by hand because redis-py's pub/sub gives one connection per subscriber and no fan-out to many
waiting threads.
"""
import logging
import threading
import time

import redis

from capacity.keys import notice_channel as channel
from common import connections
from common.process import PerProcess

logger = logging.getLogger('heavy_lanes')
POLL_SECONDS = 2.0
FALLBACK_POLL_SECONDS = 0.25
PING_SECONDS = 10.0
STALE_SECONDS = 30.0
RECONNECT_SECONDS = 1.0


def get_client():
    return connections.connect('notices')


def publish(call_id, state):
    """Announce that a call reached `state`; never raises (the waiter falls back to reading the row)."""
    try:
        get_client().publish(channel(call_id), str(state))
    except redis.RedisError:
        pass


class Hub:
    """This process's one subscriber, and the requests waiting on each call."""

    def __init__(self):
        self.waiters = {}  # call id -> set of threading.Event
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.thread = None
        self.prefix = channel('')

    def watch(self, call_id):
        """An Event that is set when `call_id`'s notice comes; give it back with `unwatch`."""
        event = threading.Event()
        with self.lock:
            self.waiters.setdefault(call_id, set()).add(event)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.run, name='heavy-lanes-notices', daemon=True)
                self.thread.start()
        return event

    def unwatch(self, call_id, event):
        with self.lock:
            events = self.waiters.get(call_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self.waiters[call_id]

    def waiting(self):
        with self.lock:
            return sum(len(events) for events in self.waiters.values())

    def wake(self, call_id):
        with self.lock:
            events = list(self.waiters.get(call_id, ()))
        for event in events:
            event.set()

    def run(self):
        while True:
            try:
                self.listen()
            except Exception as ex:  # noqa: BLE001 - the hub never dies: a closed socket raises ValueError too
                logger.warning('Completion notices lost their Redis connection (%s: %s); waiting requests read '
                               'their calls every %s s until it is back', type(ex).__name__, ex,
                               FALLBACK_POLL_SECONDS)
            self.connected.clear()
            time.sleep(RECONNECT_SECONDS)

    def listen(self):
        pubsub = get_client().pubsub(ignore_subscribe_messages=False)
        try:
            pubsub.psubscribe(self.prefix + '*')
            heard = pinged = time.monotonic()
            while True:
                message = pubsub.get_message(timeout=1.0)
                now = time.monotonic()
                if message is not None:
                    heard = now
                    kind = message.get('type')
                    if kind == 'psubscribe':
                        self.connected.set()
                    elif kind == 'pmessage':
                        name = message['channel']
                        name = name.decode() if isinstance(name, bytes) else name
                        self.wake(name[len(self.prefix):])
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


def wait_for(call_id, is_finished, timeout):
    """Wait up to `timeout` s until `is_finished()` is true; return its last value."""
    if timeout <= 0:
        return is_finished()
    deadline = time.monotonic() + timeout
    hub = get_hub()
    event = hub.watch(call_id)
    try:
        while True:
            if is_finished():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            event.wait(min(left, POLL_SECONDS if hub.connected.is_set() else FALLBACK_POLL_SECONDS))
            event.clear()
    finally:
        hub.unwatch(call_id, event)
