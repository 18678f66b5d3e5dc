"""The reconciler's view of its own pool size: its own resizes are never read as hand resizes; and its first
pass waits until the node hears its own commands."""
import threading
import time

from kombu.asynchronous import Hub

from workers.pool import PENDING_TICKS, Sizing, mailbox_heard


def test_an_own_resize_is_settled_once_it_landed_and_only_a_later_change_is_a_hand_resize():
    sizing = Sizing()
    assert sizing.observe(1) == 0          # the size at start is the first settled size
    sizing.asked(3)                        # the reconciler grows the pool to its share
    assert sizing.observe(2) == 0          # half-way there: still its own resize
    assert sizing.observe(3) == 0          # landed
    assert sizing.observe(3) == 0
    assert sizing.observe(4) == 1          # nobody asked for this: a hand grow by 1
    sizing.settled = 4                     # adopted
    assert sizing.observe(2) == -2         # a hand shrink by 2


def test_an_own_resize_that_never_lands_is_settled_as_it_is_and_not_taken_for_a_hand_one():
    sizing = Sizing()
    sizing.observe(2)
    sizing.asked(1)                        # a shrink that can't happen (every process busy)
    for _ in range(PENDING_TICKS):
        assert sizing.observe(2) == 0
    assert sizing.settled == 2 and sizing.observe(2) == 0


def test_an_own_shrink_that_never_landed_is_asked_again_until_it_does():
    sizing = Sizing()
    sizing.observe(2)
    sizing.asked(1)                        # every process busy: Celery refuses the shrink
    for _ in range(PENDING_TICKS):
        sizing.observe(2)
    assert sizing.retry(1, 2)              # settled as it is, so ask again
    sizing.asked(1)
    assert not sizing.retry(1, 2)          # pending again
    for _ in range(2):
        sizing.observe(1 if _ else 2)      # landed
    assert not sizing.retry(1, 1) and sizing.settled == 1


def test_a_hand_resize_after_a_missed_shrink_is_not_undone():
    sizing = Sizing()
    sizing.observe(2)
    sizing.asked(1)
    for _ in range(PENDING_TICKS):
        sizing.observe(2)
    assert sizing.observe(3) == 1          # a hand grow
    sizing.settled = 3                     # adopted
    assert not sizing.retry(1, 3)


def test_the_mailbox_is_heard_only_after_the_event_loops_first_tick():
    """kombu's Redis transport subscribes a node's mailbox in a tick callback of its event loop's first turn;
    the reconciler's first resize (a command to that mailbox) must wait for it. A real kombu Hub, turned
    by hand: after one turn the tick has run and the wait goes on; the second turn ends it."""
    hub = Hub()
    ticks = []
    hub.on_tick.add(lambda: ticks.append(len(ticks)))  # where the transport would subscribe
    loop = hub.create_loop()
    heard = []
    waiter = threading.Thread(target=lambda: heard.append((mailbox_heard(hub, timeout=10), len(ticks))))
    try:
        waiter.start()
        deadline = time.monotonic() + 5
        while not hub._ready and time.monotonic() < deadline:  # the waiter's callback is scheduled
            time.sleep(0.01)
        next(loop)
        waiter.join(0.3)
        assert ticks == [0] and waiter.is_alive()   # the first turn ticked: not heard yet
        next(loop)
        waiter.join(5)
        assert heard == [(True, heard[0][1])] and heard[0][1] >= 1
    finally:
        hub.close()


def test_a_loop_that_never_turns_is_not_waited_for_past_the_timeout():
    hub = Hub()
    try:
        started = time.monotonic()
        assert mailbox_heard(hub, timeout=0.2) is False
        assert time.monotonic() - started < 2
    finally:
        hub.close()
