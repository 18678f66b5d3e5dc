"""A semaphore whose size follows the server's X-OCL-Capacity-Suggested-Concurrency (or, without it, the
room the IETF RateLimit fields leave)."""
import threading


class AdaptiveLimit:
    """At most `limit` holders at once; `set()` may change the limit while slots are held.

    Lowering the limit never takes a slot away: holders finish, and no new slot is given until fewer
    than the new limit are held. The limit stays between 1 and `cap` (a suggestion of 0 — a paused lane —
    keeps one call going, which waits out the pause's Retry-After).
    """

    def __init__(self, limit, cap):
        if cap < 1:
            raise ValueError('cap must be at least 1')
        self.cap = cap
        self._limit = max(1, min(cap, limit))
        self._held = 0
        self._max_held = 0
        self._running = 0  # held by calls the server took (a handle came back) whose task is still open
        self._cond = threading.Condition()

    @property
    def limit(self):
        return self._limit

    @property
    def held(self):
        return self._held

    @property
    def max_held(self):
        return self._max_held

    def set(self, limit):
        """Change the limit (clamped to 1..cap); returns the limit now in force."""
        with self._cond:
            self._limit = max(1, min(self.cap, int(limit)))
            self._cond.notify_all()
            return self._limit

    def follow(self, capacity, first_send=False):
        """Take the suggestion in an answer's `capacity` headers (None: the answer had none). Without one,
        an admitted first send that the server did not count (the limiter is off, or a lexical call)
        lifts the limit to `cap`."""
        if capacity is None:
            return
        if capacity.suggested is not None:
            self.set(capacity.suggested)
        elif capacity.room is not None:
            # Only the standard RateLimit fields: what the server counts of ours (the calls it took that
            # still run, this one among them) plus the room it has left, and never more than the smallest
            # quota (a call that ended on the server but whose end we haven't seen yet is still counted
            # here). Calls being sent or waiting out a 429 hold a slot but are not counted there.
            with self._cond:
                running = self._running
            allowed = running + capacity.room
            if capacity.room_quota is not None:
                allowed = min(allowed, capacity.room_quota)
            self.set(allowed)
        elif first_send and not capacity.counted:
            self.set(self.cap)

    def acquire(self, stop, poll_seconds=0.1):
        """Take a slot; False (and no slot) if `stop` (a threading.Event) is set first."""
        with self._cond:
            while self._held >= self._limit:
                if stop.is_set():
                    return False
                self._cond.wait(poll_seconds)
            if stop.is_set():
                return False
            self._held += 1
            self._max_held = max(self._max_held, self._held)
            return True

    def taken(self):
        """The server took a call that holds a slot (its task is open until `done()`)."""
        with self._cond:
            self._running += 1

    def done(self):
        """A call the server took has ended."""
        with self._cond:
            self._running = max(self._running - 1, 0)

    def release(self):
        with self._cond:
            if self._held <= 0:
                raise RuntimeError('release() without acquire()')
            self._held -= 1
            self._cond.notify_all()
