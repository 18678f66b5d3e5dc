"""The calls' messages where the Redis broker keeps them: which calls have a message waiting or held
unacknowledged, and taking out the message of a call that will never run.

kombu's Redis transport (kombu/transport/redis.py, 5.7) keeps, every key under
CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix']:
- one list per queue and priority level: `<queue>` for level 0, `<queue>\\x06\\x16<level>` for the others
  (`priority_steps`); each element is a JSON message whose `headers.id` is the task id, i.e. the call id;
- the hash `unacked` (delivery tag -> JSON `[message, exchange, routing_key]`): the messages a worker took
  and hasn't acknowledged yet (a late ack: the call is running, or was when its node died), and the sorted
  set `unacked_index` (delivery tag -> the time it was taken), which kombu reads to deliver again the
  messages held longer than the visibility timeout.

Written by hand because kombu has no API to look inside a queue or take one message out of it (Celery's
`purge` empties a whole queue). Everything here reads or changes the broker only; the state of a call is
workers.lifecycle's. No Celery import.
"""
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings

from common import connections

logger = logging.getLogger('heavy_lanes')
PRIORITY_SEPARATOR = '\x06\x16'  # '<queue>\x06\x16<level>' for the levels above 0
UNACKED = 'unacked'
UNACKED_INDEX = 'unacked_index'


def prefix():
    return settings.CELERY_BROKER_TRANSPORT_OPTIONS.get('global_keyprefix', '')


def lists(queue):
    """The broker lists of `queue`, one per priority level, with the global key prefix."""
    steps = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get('priority_steps', [0, 3, 6, 9])
    return [prefix() + (queue if step == 0 else f'{queue}{PRIORITY_SEPARATOR}{step}') for step in steps]


def broker():
    return connections.connect('broker', settings.CELERY_BROKER_URL)


def message_id(raw):
    """The task id of one stored message (a list element), or None when it isn't one of ours."""
    try:
        message = json.loads(raw)
        return message['headers']['id']
    except (TypeError, ValueError, KeyError, RecursionError):
        return None


def unacked_id(raw):
    """The task id of one value of the `unacked` hash (`[message, exchange, routing_key]`), or None."""
    return unacked_headers(raw).get('id')


def unacked_headers(raw):
    """The headers of one value of the `unacked` hash ({} when it isn't one of ours)."""
    try:
        headers = json.loads(raw)[0]['headers']
    except (TypeError, ValueError, KeyError, IndexError, RecursionError):
        return {}
    return headers if isinstance(headers, dict) else {}


def eta_of(headers):
    """A message's ETA header (ISO 8601, as Celery writes it) in Unix seconds, or None."""
    eta = headers.get('eta')
    if not eta:
        return None
    try:
        moment = datetime.fromisoformat(eta)
    except (TypeError, ValueError):
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class Held:
    """One message a worker took and hasn't acknowledged: whose, its delivery tag, and when it was taken
    (Unix seconds; 0 when the index has no time for it). A message with an ETA (a task's retry with a
    countdown) is held on purpose until then: `due_at` is the later of the two."""
    call_id: str
    tag: str
    taken_at: float
    eta: float | None = None

    @property
    def due_at(self):
        return max(self.taken_at, self.eta or 0.0)


@dataclass(frozen=True)
class Snapshot:
    waiting: set  # call ids with a message on one of the queues' lists
    held: list    # Held, one per unacknowledged message

    def ids(self):
        return self.waiting | {held.call_id for held in self.held}


def snapshot(queues, client=None):
    """What the broker holds for `queues`: the waiting messages' call ids and the unacknowledged messages.

    One MULTI/EXEC, so a message moving from a list to `unacked` (a worker taking it) is seen in one place
    or the other, except in the few milliseconds between kombu's BRPOP and its write to `unacked`.
    """
    client = client or broker()
    pipe = client.pipeline(transaction=True)
    names = [name for queue in queues for name in lists(queue)]
    for name in names:
        pipe.lrange(name, 0, -1)
    pipe.hgetall(prefix() + UNACKED)
    pipe.zrange(prefix() + UNACKED_INDEX, 0, -1, withscores=True)
    replies = pipe.execute()
    waiting = {message_id(raw) for reply in replies[:-2] for raw in reply}
    waiting.discard(None)
    taken = {text(tag): score for tag, score in replies[-1]}
    held = []
    for tag, raw in replies[-2].items():
        headers = unacked_headers(raw)
        if headers.get('id') is not None:
            held.append(Held(headers['id'], text(tag), taken.get(text(tag), 0.0), eta_of(headers)))
    return Snapshot(waiting, held)


def present(queues, client=None):
    """The call ids with a message on the broker: waiting in one of `queues`' lists, or unacknowledged."""
    return snapshot(queues, client).ids()


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def drop_held(held, client=None):
    """Take one unacknowledged message off the broker's books (`unacked` and its index); whether it was
    still there. For a message its worker lost (the call never started) or of a call that ended: kombu
    would otherwise deliver it again only after the visibility timeout. A worker that still holds it and
    acknowledges it later removes nothing."""
    client = client or broker()
    pipe = client.pipeline(transaction=True)
    pipe.hdel(prefix() + UNACKED, held.tag)
    pipe.zrem(prefix() + UNACKED_INDEX, held.tag)
    return bool(pipe.execute()[0])


def discard(call_id, queue, client=None):
    """Take the waiting messages of `call_id` out of `queue`'s lists; return how many were removed.

    For a call that will never run (cancelled or expired while queued), so a queue's depth counts only
    calls that still wait. A worker that takes the message first finds the call ended and skips it.
    """
    client = client or broker()
    removed = 0
    for name in lists(queue):
        for raw in client.lrange(name, 0, -1):
            if message_id(raw) == call_id:
                removed += client.lrem(name, 1, raw)
    return removed


def discard_all(call_ids, queue, client=None):
    """`discard` for many calls of `queue` at once: each list read once, the removals sent in one round
    trip (a run of hundreds of calls, each discarded alone, read the whole queue once per call). How many
    messages were removed."""
    client = client or broker()
    wanted = set(call_ids)
    pipe = client.pipeline(transaction=False)
    for name in lists(queue):
        for raw in client.lrange(name, 0, -1):
            if message_id(raw) in wanted:
                pipe.lrem(name, 1, raw)
    return sum(pipe.execute())


def ahead(queue, priority, client=None):
    """Messages waiting in `queue`'s lists at `priority`'s level and the levels that run before it (lower
    numbers first): for a message of that priority published last, its place. O(levels) LLENs."""
    client = client or broker()
    steps = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get('priority_steps', [0, 3, 6, 9])
    pipe = client.pipeline(transaction=False)
    for step, name in zip(steps, lists(queue)):
        if step <= priority:
            pipe.llen(name)
    return sum(pipe.execute())


def depth(queue, client=None):
    """Messages waiting in `queue`'s lists (every priority level)."""
    client = client or broker()
    pipe = client.pipeline(transaction=False)
    for name in lists(queue):
        pipe.llen(name)
    return sum(pipe.execute())
