"""Leases kept alive by the process that holds them, so that none outlives its holder by more than one lease.

A lease is taken for a short time and renewed by whoever holds it: a running call's worker (capacity.lease.
LeaseRenewer), the sweep for a work that waits in its queue (workers.sweep), and an API process for the
leases it holds while a request waits (its slot in this host's lane). The keeper is that API process's one
thread for all of them:

    keeper = get_keeper()
    keeper.keep(lease, every=renew_seconds, until=deadline)   # renewed until let go, released or `until`
    ...
    keeper.let_go(lease)

A kept lease is renewed every `every` seconds to its own `lease_ms`, until it is let go of, a renewal finds it
gone, or `until` (epoch seconds: the end of the longest the request may wait) passes. A process that dies
stops renewing: its leases come back within their `lease_ms` of its last renewal, instead of at the end of
a wait minutes away.

Renewals go through the lane store's verbs (capacity.store), so they fail open like everything else: a
renewal Redis couldn't answer is tried again at the next turn; a lease found partly gone is let go of and
left to expire (renewing the rest would count the call in only some lanes). Written by hand: one daemon
thread per process serves any number of leases, and needs the store's verbs and its fail-open rule.
"""
import logging
import threading
import time

from capacity.store import Unknown
from common.process import PerProcess

logger = logging.getLogger('heavy_lanes')
MIN_TURN_SECONDS = 0.05


class Kept:
    __slots__ = ('lease', 'every', 'until', 'due')

    def __init__(self, lease, every, until):
        self.lease, self.every, self.until = lease, every, until
        self.due = time.monotonic() + every


class Keeper:
    """One process's kept leases and the daemon thread that renews them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.kept = {}  # id(lease) -> Kept
        self.wake = threading.Event()
        self.thread = None
        self.renewals = 0

    def keep(self, lease, every, until=None):
        """Renew `lease` every `every` s until let go of, released elsewhere, or `until` (epoch s) passes;
        nothing to do for a lease that holds nothing."""
        if not lease.holding or not lease.keys:
            return
        with self.lock:
            self.kept[id(lease)] = Kept(lease, max(float(every), MIN_TURN_SECONDS), until)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.run, name='ocl-capacity-keeper', daemon=True)
                self.thread.start()
        self.wake.set()

    def let_go(self, lease):
        with self.lock:
            self.kept.pop(id(lease), None)

    def count(self):
        with self.lock:
            return len(self.kept)

    def run(self):
        while True:
            with self.lock:
                due = min((kept.due for kept in self.kept.values()), default=None)
            self.wake.wait(None if due is None else max(due - time.monotonic(), 0))
            self.wake.clear()
            self.turn()

    def turn(self, now=None):
        """Renew every kept lease that is due (the thread's work; tests call it)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            due = [kept for kept in self.kept.values() if kept.due <= now]
        for kept in due:
            lease = kept.lease
            if kept.until is not None and time.time() >= kept.until:
                self.let_go(lease)
                continue
            held = lease.store.renew(lease.keys, lease.token, lease.lease_ms)
            self.renewals += 1
            kept.due = now + kept.every
            if not isinstance(held, Unknown) and held < len(lease.keys):
                self.let_go(lease)  # released (its call ended), or partly expired: nothing more to keep


_keepers = PerProcess(Keeper)


def get_keeper():
    """This process's keeper (a new one in a forked child)."""
    return _keepers.get()
