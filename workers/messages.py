"""The calls' messages where the Redis broker keeps them: which calls have a message waiting or held
unacknowledged, and taking out the message of a call that will never run.

kombu's Redis transport (kombu/transport/redis.py, 5.7) keeps, every key under
CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix']:
- one list per queue and priority level: `<queue>` for level 0, `<queue>\\x06\\x16<level>` for the others
  (`priority_steps`); each element is a JSON message whose `headers.id` is the task id, i.e. the call id;
- the hash `unacked` (delivery tag -> JSON `[message, exchange, routing_key]`): the messages a worker took
  and hasn't acknowledged yet (a late ack: the call is running, or was when its node died).

Written by hand because kombu has no API to look inside a queue or take one message out of it (Celery's
`purge` empties a whole queue). Everything here reads or changes the broker only; the state of a call is
workers.lifecycle's. No Celery import.
"""
import json
import logging

from django.conf import settings

from common import connections

logger = logging.getLogger('heavy_lanes')
PRIORITY_SEPARATOR = '\x06\x16'  # '<queue>\x06\x16<level>' for the levels above 0
UNACKED = 'unacked'


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
    try:
        return json.loads(raw)[0]['headers']['id']
    except (TypeError, ValueError, KeyError, IndexError, RecursionError):
        return None


def present(queues, client=None):
    """The call ids with a message on the broker: waiting in one of `queues`' lists, or unacknowledged.

    One MULTI/EXEC, so a message moving from a list to `unacked` (a worker taking it) is seen in one place
    or the other, except in the few milliseconds between kombu's BRPOP and its write to `unacked`.
    """
    client = client or broker()
    pipe = client.pipeline(transaction=True)
    names = [name for queue in queues for name in lists(queue)]
    for name in names:
        pipe.lrange(name, 0, -1)
    pipe.hvals(prefix() + UNACKED)
    replies = pipe.execute()
    ids = {message_id(raw) for reply in replies[:-1] for raw in reply}
    ids.update(unacked_id(raw) for raw in replies[-1])
    ids.discard(None)
    return ids


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


def depth(queue, client=None):
    """Messages waiting in `queue`'s lists (every priority level)."""
    client = client or broker()
    pipe = client.pipeline(transaction=False)
    for name in lists(queue):
        pipe.llen(name)
    return sum(pipe.execute())
