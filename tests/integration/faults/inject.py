"""Faults injected by hand into a real stack's broker, shared by the fault tests and bench/soak.py: a call's
message found where kombu keeps it (waiting on a list, or taken and not acknowledged) and pushed again, byte
for byte, as redis-py's retry of a publish that timed out (or a restore) leaves it. No pytest, no Django
test machinery: the soak imports this from its own stack."""
import json

from workers import messages


def waiting_entry(broker, call_id, queue='es2_knn'):
    """(list name, raw entry) of the call's message waiting on `queue`'s lists, or None."""
    for name in messages.lists(queue):
        for raw in broker.lrange(name, 0, -1):
            if messages.message_id(raw) == call_id:
                return name, raw
    return None


def taken_entry(broker, call_id):
    """The raw message of the call that a worker took and hasn't acknowledged (kombu's `unacked` hash)."""
    for raw in broker.hvals(messages.prefix() + messages.UNACKED):
        if messages.unacked_id(raw) == call_id:
            return json.dumps(json.loads(raw)[0])
    return None


def push_copy(broker, raw, queue):
    """Put one more copy of a message on `queue`'s first list (where a worker takes it next)."""
    broker.lpush(messages.lists(queue)[0], raw)
