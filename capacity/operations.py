"""The limiter's Redis operations, one method each: the Lua scripts of `capacity/lua/` and a few commands.

This is the raising layer under the lane store (capacity.store), and what the store's contract suite tests
on fakeredis and the real Redis: each method does one thing to Redis through the Runner (its deadline, its
established connections) and raises what it met. Nothing here decides to fail open.

Each lane is a Redis sorted set of leases (member = lease token = the task id; score = expiry in epoch ms by
Redis's clock). Scripts are read once from package data and registered per client (EVALSHA, loaded again
on NOSCRIPT).

It raises:
- `redis.TimeoutError` when Redis gave no answer within the deadline, or ran an acquire after its caller
  stopped waiting (LATE_ACQUIRE: no lease was taken then);
- `redis.ConnectionError` when the Redis thread's queue is full, or from redis-py;
- any other `redis.RedisError` from redis-py or from a script;
- `BadCall` (a ValueError) for a call that makes no sense (no keys, keys and limits of different lengths).
"""
import functools
import importlib.resources
import threading
import time
from dataclasses import dataclass, field

import redis
from django.conf import settings

from capacity.constants import DECISION_SERIES_MINUTES
from capacity.keys import (
    counters_key, decisions_minute_key, expired_key, hold_field, holds_key, lane_pattern, run_field,
)

SCRIPTS = ('acquire', 'renew', 'release', 'count', 'unclaim', 'rate')  # capacity/lua/<name>.lua, one each
SCAN_COUNT = 100
NOT_AFTER_SLACK_SECONDS = 2  # room for the clocks of this host and Redis to differ
LATE_ACQUIRE = 'Redis ran the acquire after its caller stopped waiting; no lease was taken'
MAX_ENCODED_LANES = 10_000  # sets of lanes whose acquire arguments are kept encoded, per process
HOLD_WEIGHT = 0.2  # the newest release's weight in a lane's mean hold: about the last 5 releases count


class BadCall(ValueError):
    """A call that makes no sense, refused before anything is sent (a bug, never an outage)."""


PRELUDE_LINE = '-- #prelude'  # a script's line that stands for capacity/lua/prelude.lua (its clock and `keep`)


def read_lua(name):
    return importlib.resources.files('capacity').joinpath('lua', f'{name}.lua').read_text(encoding='utf-8')


@functools.cache
def read_script(name):
    """The Lua source of one operation, shipped as package data, with the shared prelude in place of its
    `-- #prelude` line (written once, in capacity/lua/prelude.lua)."""
    lines = read_lua(name).split('\n')
    if PRELUDE_LINE in lines:
        at = lines.index(PRELUDE_LINE)
        lines[at:at + 1] = read_lua('prelude').rstrip('\n').split('\n')
    return '\n'.join(lines)


def release_call(keys, token, acquired_ms, ran, within_limit=True):
    """The release script's keys and arguments (capacity/lua/release.lua)."""
    field_name, run_ms = (run_field(ran[0]), max(int(ran[1]), 0)) if ran is not None else ('', 0)
    args = [token, int(acquired_ms or 0), '1' if within_limit else '0', HOLD_WEIGHT, field_name, run_ms,
            *(hold_field(key) for key in keys)]
    return [*keys, holds_key()], args


class RedisClock:
    """How far Redis's clock is ahead of this host's (ms; negative when behind), learnt from the acquires'
    replies (each carries Redis's clock when it ran). An acquire's `not_after_ms` is on Redis's clock: from
    this host's alone, a host whose clock is more than the slack behind Redis's had every acquire refused as
    late, and one ahead gave a hung Redis that much longer to take leases nobody waits for."""

    def __init__(self):
        self.offset_ms = 0.0

    def learn(self, redis_ms, sent, received):
        """Redis said `redis_ms` between this host's `sent` and `received` (time.time())."""
        self.offset_ms = redis_ms - (sent + received) * 500.0

    def now_ms(self):
        return time.time() * 1000 + self.offset_ms


CLOCK = RedisClock()  # per process; a forked child starts from its parent's reading


def get_not_after_ms():
    """Epoch ms by Redis's clock after which it must not run an acquire: the caller's deadline plus slack."""
    return int(CLOCK.now_ms() + (settings.CAPACITY_REDIS_DEADLINE_SECONDS + NOT_AFTER_SLACK_SECONDS) * 1000)


def text(value):
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Acquired:
    """What an acquire did: whether it took the leases, and each lane's count before this call.

    Two readings come with it and are left out of comparisons (they are measurements, not the outcome):
    `acquired_ms`, Redis's clock when it ran (epoch ms: what a release measures the hold from), and, when
    a lane was full, `holds`: each lane's mean hold in ms (None where nothing was measured yet).
    """

    taken: bool
    counts: tuple[int, ...]
    acquired_ms: int = field(default=0, compare=False)
    holds: tuple[int | None, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Ended:
    """What a run's end sent in its one round trip (Operations.release_and_end): each step's own answer, or
    the exception it alone raised (None for a step that wasn't asked for)."""

    removed: object = None
    published: object = None
    unclaimed: object = None


@dataclass(frozen=True)
class Counted:
    """What counting one request in a rate window did (Operations.count_request): whether it was admitted,
    the requests now in the window (this one included when admitted), and the ms until the oldest of them
    leaves it."""

    admitted: bool
    in_window: int
    reset_ms: int


class Operations:
    """The operations on one Redis, through one Runner."""

    def __init__(self, runner):
        self.runner = runner
        self._lock = threading.Lock()
        self._scripts = {}  # name -> redis.commands.core.Script, registered on `_scripts_client`
        self._scripts_client = None
        self._lanes = {}  # (prefix, keys) -> what acquire sends for those lanes, encoded (`encoded_lanes`)

    def script(self, name):
        """The script `name` (a redis-py Script: it runs on any client of this Redis)."""
        client = self.runner.client
        with self._lock:
            if self._scripts_client is not client:
                self._scripts, self._scripts_client = {}, client
            script = self._scripts.get(name)
            if script is None:
                # register_script only hashes the source; EVALSHA runs it and loads it on NOSCRIPT.
                script = self._scripts[name] = client.register_script(read_script(name))
            return script

    def run_script(self, client, name, keys, args):
        """Run one Lua script on `client` (called through the runner): EVALSHA, and on NOSCRIPT (a restarted
        or flushed Redis) the Script's own call, which loads it and runs it again. EVALSHA is sent here,
        not through Script.__call__, which costs every acquire an import and two tuple copies."""
        script = self.script(name)
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return script(keys=keys, args=args, client=client)

    def _script(self, name, keys, args):
        return self.runner.operate(self.run_script, name, keys, args)

    def _command(self, name, *args, **kwargs):
        return self.runner.operate(lambda client: getattr(client, name)(*args, **kwargs))

    # --- lanes

    def encoded_lanes(self, keys):
        """(KEYS, hold fields) of the acquire script for the lanes `keys`, encoded as the client would encode
        them: the same bytes on every call to the same lanes, so they are encoded once (redis-py encodes
        each str argument of every command again). Remembered per key prefix, which names the counters."""
        remembered = (settings.CAPACITY_KEY_PREFIX, tuple(keys))
        lanes = self._lanes.get(remembered)
        if lanes is None:
            encode = self.runner.client.get_encoder().encode
            lanes = (tuple([encode(key) for key in (*keys, expired_key(), holds_key())]),
                     tuple([encode(hold_field(key)) for key in keys]))
            if len(self._lanes) >= MAX_ENCODED_LANES:
                self._lanes.clear()  # bound the memory; the next calls refill it
            self._lanes[remembered] = lanes
        return lanes

    def acquire(self, keys, limits, token, lease_ms, force, not_after_ms=None):
        """Take a lease (expiring in `lease_ms` ms) in every lane of `keys`, or in none; an Acquired.

        `limits` are the lanes' limits, in `keys` order. Not forced, a call takes nothing when a lane is full
        (count >= limit). `not_after_ms` (epoch ms) defaults to get_not_after_ms(); Redis running the script
        later than that raises redis.TimeoutError(LATE_ACQUIRE) and takes nothing — unless it answered within
        the deadline and the deadline was this call's own, which was then set by a clock that was wrong: it is
        sent once more, set by Redis's clock as that answer told it (RedisClock).
        """
        keys, limits = list(keys), [int(limit) for limit in limits]
        if not keys or len(keys) != len(limits):
            raise BadCall(f'acquire needs keys and one limit per key, got {len(keys)} keys and '
                          f'{len(limits)} limits')
        own_deadline = not_after_ms is None
        script_keys, fields = self.encoded_lanes(keys)
        for _attempt in range(2 if own_deadline else 1):
            if own_deadline:
                not_after_ms = get_not_after_ms()
            args = [token, int(lease_ms), '1' if force else '0', int(not_after_ms), *limits, *fields]
            sent = time.time()
            result = self._script('acquire', script_keys, args)
            received = time.time()
            if len(result) > 1:
                CLOCK.learn(int(result[1]), sent, received)
            if int(result[0]) != -1:
                break
            # Late by Redis's clock though the answer came within the deadline: the clock was wrong, not
            # Redis slow. Once more, with the deadline on the clock just learnt.
            if not own_deadline or received - sent >= settings.CAPACITY_REDIS_DEADLINE_SECONDS:
                raise redis.TimeoutError(LATE_ACQUIRE)
        else:
            raise redis.TimeoutError(LATE_ACQUIRE)
        lanes = len(keys)
        holds = tuple(None if int(hold) < 0 else int(hold) for hold in result[2 + lanes:2 + 2 * lanes])
        return Acquired(taken=bool(int(result[0])), counts=tuple(int(count) for count in result[2:2 + lanes]),
                        acquired_ms=int(result[1]), holds=holds)

    def renew(self, keys, token, lease_ms):
        """Move every lease of `token` to expire `lease_ms` ms from now, only if all are held; return held."""
        keys = list(keys)
        if not keys:
            raise BadCall('renew needs at least one key')
        return int(self._script('renew', keys, [token, int(lease_ms)]))

    def release(self, keys, token, acquired_ms=0, ran=None, within_limit=True):
        """Remove the leases of `token`; return how many were removed (0 on a second release).

        With `acquired_ms` (Redis's clock at the acquire, Acquired.acquired_ms), each lane whose lease this
        removed measures how long it was held, unless the call went past a lane's limit (`within_limit`
        False: shadow mode let it run; capacity.decisions.holds_measured); with `ran` (queue, run_ms), the
        queue measures how long the call ran. All in the release's own script: no round trip of their own.
        """
        keys = list(keys)
        if not keys and ran is None:
            return 0
        return int(self._script('release', *release_call(keys, token, acquired_ms, ran, within_limit)))

    def release_and_end(self, keys, token, acquired_ms=0, ran=None, notice=None, work=None, within_limit=True):
        """A run's end in one round trip: `release`, then PUBLISH `notice` ((channel, message)) when given,
        then `unclaim(*work)` when given ((claim key, token, pointer key, pointer ms): the work's claim
        given up and its warm pointer set), pipelined, so the pool process waits on Redis once where it
        waited three times (docs/benchmarks.md, section 10). An Ended: an error in one step doesn't undo the
        others. The pipeline failing as a whole (no answer in time) raises, and then any of them may have
        run."""
        return self.runner.operate(self._run_end, list(keys), token, acquired_ms, ran, notice, work, within_limit)

    def release_and_end_all(self, ends):
        """`release_and_end` for many runs' ends in one round trip: `ends` are (keys, token, acquired_ms, ran,
        notice, work, within_limit) each; an Ended each, in their order (a client's run cancelled:
        workers.lifecycle)."""
        return self.runner.operate(self._run_ends, [(list(keys), *rest) for keys, *rest in ends])

    def _run_end(self, client, keys, token, acquired_ms, ran, notice, work, within_limit=True):
        """The pipeline of `release_and_end` on `client`."""
        return self._run_ends(client, [(keys, token, acquired_ms, ran, notice, work, within_limit)])[0]

    def _run_ends(self, client, ends):
        """One pipeline of every end's steps on `client`. EVALSHA alone: a script Redis doesn't have (after a
        restart or SCRIPT FLUSH) is run again on its own, which loads it (a second round trip, rarely)."""
        everyone = []  # per end: what -> (script name or None, keys, args), in the pipeline's order
        for keys, token, acquired_ms, ran, notice, work, within_limit in ends:
            steps = {}
            if keys or ran is not None:
                steps['removed'] = ('release', *release_call(keys, token, acquired_ms, ran, within_limit))
            if notice is not None:
                steps['published'] = (None, [], list(notice))
            if work is not None:
                claim_key, work_token, pointer_key, pointer_ms = work
                steps['unclaimed'] = ('unclaim', [claim_key, pointer_key], [work_token, int(pointer_ms)])
            everyone.append(steps)
        pipe = client.pipeline(transaction=False)
        for steps in everyone:
            for name, step_keys, args in steps.values():
                if name is None:
                    pipe.publish(*args)
                else:
                    pipe.evalsha(self.script(name).sha, len(step_keys), *step_keys, *args)
        replies = iter(pipe.execute(raise_on_error=False))
        ended = []
        for steps in everyone:
            answers = {what: next(replies) for what in steps}
            for what, (name, step_keys, args) in steps.items():
                if isinstance(answers[what], redis.exceptions.NoScriptError):
                    try:
                        answers[what] = self.run_script(client, name, step_keys, args)
                    except redis.RedisError as ex:
                        answers[what] = ex
            for what in ('removed', 'unclaimed'):
                if what in answers and not isinstance(answers[what], Exception):
                    answers[what] = int(answers[what] or 0)
            ended.append(Ended(**answers))
        return ended

    def count(self, keys):
        """Each lane's unexpired leases, in `keys` order (nothing is pruned)."""
        keys = list(keys)
        if not keys:
            return []
        return [int(count) for count in self._script('count', keys, [])]

    def scores(self, keys, token):
        """(Redis's clock in epoch ms, [the expiry of `token`'s lease in each lane, or None]) in one round
        trip. Reads only."""
        def read(client):
            pipe = client.pipeline(transaction=False)
            pipe.time()
            for key in keys:
                pipe.zscore(key, token)
            (seconds, micros), *scores = pipe.execute()
            return int(seconds) * 1000 + int(micros) // 1000, scores
        return self.runner.operate(read)

    def find_keys(self, lane):
        """Every key of a lane that has parts (e.g. each host's api_heavy_task key), sorted."""
        def scan():
            keys = self.runner.client.scan_iter(match=lane_pattern(lane), count=SCAN_COUNT)
            return sorted({text(key) for key in keys})
        return self.runner.call(scan)

    def count_request(self, key, token, limit, window_ms):
        """Count the request `token` in the sliding window `key` (rate.lua) if fewer than `limit` were counted
        in its last `window_ms` ms by Redis's clock; a Counted. One script: concurrent requests never share a
        place, and a refusal writes nothing.

        On the caller's thread over the runner's client (its pool, its socket timeouts: at most the deadline),
        not through `operate`: every request of the API takes this path, and a burst of 32 requests into a
        process with no idle connection queued their connects on the one Redis thread past the deadline (14
        of the first 64 of tests/integration/faults/test_rate_limit_concurrency.py failed open that way). A
        connect here is bounded by the connect timeout, not the deadline (docs/architecture.md).
        """
        try:
            limit, window_ms = int(limit), int(window_ms)
        except (TypeError, ValueError):
            raise BadCall(f'count_request needs whole numbers, not {limit!r} and {window_ms!r}') from None
        if limit < 0 or window_ms <= 0:
            raise BadCall(f'count_request needs limit >= 0 and window_ms > 0, not {limit} and {window_ms}')
        answer = self.run_script(self.runner.client, 'rate', [key], [token, limit, window_ms])
        return Counted(bool(int(answer[0])), int(answer[1]), int(answer[2]))

    # --- claims (a string key naming who does a piece of work for everyone)

    def claim(self, key, token, ms):
        """SET `key` to `token` for `ms` ms unless it exists; True when this call took it."""
        return bool(self._command('set', key, token, nx=True, px=int(ms)))

    def unclaim(self, key, token, pointer_key=None, pointer_ms=0):
        """Delete the claim `key` if `token` still holds it (True when it did); with `pointer_key` and
        `pointer_ms` > 0, also point `pointer_key` at `token` for that long, in the same script."""
        keys, args = [key], [token]
        if pointer_key is not None:
            keys, args = [key, pointer_key], [token, int(pointer_ms)]
        return bool(int(self._script('unclaim', keys, args)))

    def keep(self, key, seconds, value=None):
        """Make `key` expire in `seconds` s (and, with `value`, hold that instead); True when it existed."""
        if value is None:
            return bool(self._command('expire', key, int(seconds)))
        return bool(self._command('set', key, value, xx=True, ex=int(seconds)))

    def read(self, *keys):
        """The values of string keys, decoded (None where missing)."""
        return [text(value) for value in self._command('mget', list(keys))]

    # --- measurements and counters

    def holds(self):
        """{field: mean ms} of every measurement in the hold-time hash (capacity.keys.hold_field and
        run_field name them), without the sample counts."""
        raw = self._command('hgetall', holds_key())
        return {text(name): int(value) for name, value in raw.items() if '|' not in text(name)}

    def hold(self, field_name):
        """One measurement of the hold-time hash in ms, or None when nothing was measured yet."""
        value = self._command('hget', holds_key(), field_name)
        return int(value) if value is not None else None

    def expired_total(self):
        """How many leases acquire found expired (never released) since the counter began."""
        return int(self._command('get', expired_key()) or 0)

    def counters(self):
        """{field: count} of the event counters hash (capacity.counters)."""
        return {text(name): int(value) for name, value in self._command('hgetall', counters_key()).items()}

    def add_counts(self, counts, minutes=None, prefix=None):
        """Add each {field: n} to the event counters hash, and each {(minute, decision): n} of `minutes` to
        that minute's hash, which expires DECISION_SERIES_MINUTES after its minute; one pipeline (run on the
        Redis thread by capacity.counters: it waits for nobody). `prefix`: the key prefix they were counted
        under (the settings' when None)."""
        pipe = self.runner.client.pipeline(transaction=False)
        key = counters_key(prefix)
        for name, count in counts.items():
            pipe.hincrby(key, name, count)
        for (minute, decision), count in (minutes or {}).items():
            minute_key = decisions_minute_key(minute, prefix)
            pipe.hincrby(minute_key, decision, count)
            # Gone an hour after its minute, whenever this ran (EXPIREAT is absolute).
            pipe.expireat(minute_key, (int(minute) + DECISION_SERIES_MINUTES + 1) * 60)
        pipe.execute()

    def decision_counts(self, minutes):
        """{decision: count} of each of `minutes` (whole minutes since the epoch), in order, in one round
        trip; {} for a minute without decisions (or gone)."""
        def read(client):
            pipe = client.pipeline(transaction=False)
            for minute in minutes:
                pipe.hgetall(decisions_minute_key(minute))
            return [{text(name): int(value) for name, value in raw.items()} for raw in pipe.execute()]
        return self.runner.operate(read)

    def ping(self):
        return bool(self._command('ping'))
