"""A call is counted while it holds a pool slot, even when its process hangs.

A running work's own pool process renews its leases and beats its row (workers.execution's heartbeat). A
process that stops making progress (SIGSTOP, a C call that never returns the GIL, swapped out) stops both:
its leases expired after `lease_seconds` while the process kept its slot until the hard time limit
(`max_hold_seconds` + `renew_seconds`), so the lane admitted another call for a slot nobody could use.

The node's main process hands the calls to its pool and kills a process at its hard time limit, so it
vouches for them: every `renew_seconds` the SlotKeeper renews the leases of each work a live pool process of
this node runs (Celery's `active_requests`: accepted, not yet returned) and beats its row, by the database's
clock. It stops with the slot: when the work ends, its process exits, or the hard limit kills it (then the
worker ends the work, workers.signals.end_timed_out). A node that dies stops vouching with it, and the sweep
takes its work over as before.

Written by hand: Celery has no hook that runs in the main process while a task runs; `active_requests` (a
module-level set in celery.worker.state, filled and emptied by the consumer) is what the pool holds.
"""
import logging
import threading

from django.db import connection
from django.db.models.functions import Now

from capacity.config import get_config
from common.database import drop_broken_connections
from workers.celery import TASK_NAME
from workers.lifecycle import worker_lease
from workers.models import State, Work
from workers.pool import fork_guard

logger = logging.getLogger('heavy_lanes')


def process_alive(pid):
    """Whether `pid` exists and hasn't exited (a zombie has freed its slot); a stopped process is alive."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except OSError:
        return False


def held_slots():
    """{work id: pool process id} of the lane works this process's pool runs now."""
    from celery.worker import state
    for _ in range(3):
        try:
            requests = list(state.active_requests)
            break
        except RuntimeError:  # the consumer changed the set while it was copied: copy again
            continue
    else:
        return {}
    return {request.id: request.worker_pid for request in requests
            if request.name == TASK_NAME and request.worker_pid}


class SlotKeeper:
    """The thread of a node's main process that keeps its running works counted (see the module docstring)."""

    def __init__(self, node):
        self.node = node
        self.stopping = threading.Event()
        self.thread = None
        self.kept = 0  # works kept at the last turn (tests, logs)

    def start(self):
        self.thread = threading.Thread(target=self.run, name='heavy-lanes-slots', daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()

    def run(self):
        while not self.stopping.wait(get_config().renew_seconds):
            try:
                with fork_guard:  # database and Redis clients: not while the pool forks a new process
                    self.kept = self.turn()
            except Exception:  # noqa: BLE001 - the next turn tries again; a process's own heartbeat goes on
                logger.exception('Could not keep the running works of %s counted', self.node)
                connection.close()

    def turn(self):
        """Renew the leases and beat the rows of the works live pool processes of this node run; how many."""
        slots = {work_id: pid for work_id, pid in held_slots().items() if process_alive(pid)}
        if not slots:
            return 0
        drop_broken_connections()
        runners = {f'{self.node} pid {pid}' for pid in slots.values()}
        # Only the run on this node by the process that holds the slot: another delivery may own it now.
        works = [work for work in Work.objects.filter(pk__in=list(slots), state=State.RUNNING, worker__in=runners)
                 .only('id', 'lease', 'worker') if work.worker == f'{self.node} pid {slots[work.pk]}']
        if not works:
            return 0
        lease_ms = get_config().lease_seconds * 1000
        for work in works:
            worker_lease(work, lease_ms).renew()  # fails open (capacity.store); held or not, the slot is
        Work.objects.filter(pk__in=[work.pk for work in works], state=State.RUNNING,
                            worker__in=[work.worker for work in works]).update(heartbeat_at=Now())
        return len(works)
