"""What a call's owner sees is a pure function of the call and its work (workers.lifecycle.seen), as a table:
one row per kind of call and state of its work."""
from datetime import UTC, datetime, timedelta

import pytest

from workers.lifecycle.seen import CANCELLED, EXPIRED, FAILED, Seen, seen
from workers.models import Call, ServedAs, State, Work

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def work(state, started=None, finished=None, error=''):
    return Work(state=state, started_at=started, finished_at=finished, error=error)


def call(served_as=ServedAs.RUN, made=0, cancelled=None):
    return Call(served_as=served_as, created_at=at(made), cancelled_at=cancelled)


@pytest.mark.parametrize('the_call, the_work, expected', [
    # its own work, as it goes
    (call(), work(State.QUEUED), Seen(State.QUEUED)),
    (call(), work(State.RUNNING, at(1)), Seen(State.RUNNING, at(1))),
    (call(), work(State.SUCCEEDED, at(1), at(5)), Seen(State.SUCCEEDED, at(1), at(5))),
    (call(), work(State.FAILED, at(1), at(5), 'ValueError: x'), Seen(State.FAILED, at(1), at(5), 'ValueError: x')),
    (call(), work(State.FAILED, at(1), at(5)), Seen(State.FAILED, at(1), at(5), FAILED)),  # no message: the state's
    (call(), work(State.EXPIRED, None, at(600)), Seen(State.EXPIRED, None, at(600), EXPIRED)),
    (call(), work(State.CANCELLED, None, at(3)), Seen(State.CANCELLED, None, at(3), CANCELLED)),
    # a running work never shows a finish, whatever its row holds
    (call(), work(State.RUNNING, at(1), at(2)), Seen(State.RUNNING, at(1))),
    # a call that joined a work shows the work as it is, its start included (even one before the call)
    (call(ServedAs.COALESCED, made=3), work(State.RUNNING, at(1)), Seen(State.RUNNING, at(1))),
    (call(ServedAs.COALESCED, made=3), work(State.SUCCEEDED, at(1), at(5)), Seen(State.SUCCEEDED, at(1), at(5))),
    # its owner cancelled it: cancelled from then on, whatever its work does
    (call(cancelled=at(4)), work(State.RUNNING, at(1)), Seen(State.CANCELLED, at(1), at(4), CANCELLED)),
    (call(cancelled=at(4)), work(State.SUCCEEDED, at(1), at(9)), Seen(State.CANCELLED, at(1), at(4), CANCELLED)),
    (call(cancelled=at(4)), work(State.QUEUED), Seen(State.CANCELLED, None, at(4), CANCELLED)),
    # ... and a start after the cancel is the work's, not the call's
    (call(cancelled=at(4)), work(State.RUNNING, at(6)), Seen(State.CANCELLED, None, at(4), CANCELLED)),
    # a warm result answered it when it was made
    (call(ServedAs.CACHED, made=50), work(State.SUCCEEDED, at(1), at(5)), Seen(State.SUCCEEDED, at(50), at(50))),
])
def test_what_the_owner_of_a_call_sees(the_call, the_work, expected):
    assert seen(the_call, the_work) == expected


def test_a_call_is_finished_for_its_owner_in_a_final_state_only():
    assert not seen(call(), work(State.RUNNING, at(1))).finished
    assert seen(call(cancelled=at(2)), work(State.RUNNING, at(1))).finished
