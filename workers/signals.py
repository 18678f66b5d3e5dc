"""The lane workers' Celery signal handlers, in the worker's main process (imported by workers only).

Celery imports this module at worker start (the app's `include`); an API process never does, so none of
these handlers runs, or is even registered, outside a worker.

- `task_revoked`: a call that won't run or was stopped — ended and its leases freed (workers.lifecycle),
  for a call terminated while it ran once the pool process that ran it has exited;
- `task_failure` with TimeLimitExceeded: Celery killed the pool process running a call at its hard time
  limit — the call ends `failed` saying so and its leases are freed (lifecycle.time_out); the message is
  acknowledged by Celery (acks_on_timeout), so it is not delivered again;
- `task_prerun`, `task_postrun`: bind the call's request id (a header of its message) while it runs, in the
  pool process, so every log line of it carries the id (common.jsonlog); before a task, drop a database
  connection that failed and is gone (common.database.drop_broken_connections), as `task_revoked` and
  `task_failure` do in the main process; `worker_process_init`: a new pool process lets go of its
  parent's connections without touching them (common.database.forget_inherited_connections), builds
  its result backend and, on a node of bulk lanes only, lowers its CPU priority (`yield_to_requests`);
- `celeryd_after_setup`, `worker_ready`, `worker_shutdown`: don't consume a paused queue at start, load the
  match indexes before the pool forks (concepts.services.warm) and freeze what is loaded out of the
  garbage collector's reach, and start and stop the node's pool reconciler (workers.pool).

It also replaces Celery's event heartbeat with one that doesn't retry (see `Heart`).
"""
import gc
import logging
import os
import threading
import time

from celery.exceptions import TimeLimitExceeded
from celery.signals import (
    celeryd_after_setup, task_failure, task_postrun, task_prerun, task_revoked, worker_process_init, worker_ready,
    worker_shutdown,
)
from celery.worker import heartbeat

from capacity.config import get_config
from common.database import drop_broken_connections, forget_inherited_connections
from django.conf import settings
from django.db import connection

from common import request_id
from workers import lanes, lifecycle
from workers.models import State, Work
from workers.pool import PoolReconciler, fork_guard
from workers.slots import SlotKeeper

logger = logging.getLogger('heavy_lanes')


class Heart(heartbeat.Heart):
    """The worker's `worker-heartbeat` event, sent once instead of retried until the broker answers.

    Celery sends it from the worker's main loop with `retry=True` and no limit, so while Redis stalled the
    loop stopped in kombu's reconnect loop: no message was received and no acknowledgement sent until Redis
    came back. Sent once, a heartbeat that fails is buffered by the event dispatcher (its
    buffer_while_offline) and the loop goes on. Celery has no setting for this; the step that builds the
    heartbeat reads `celery.worker.heartbeat.Heart`, which this module sets (in worker processes only).
    """

    def _send(self, event, retry=False):
        return super()._send(event, retry=False)


heartbeat.Heart = Heart


@task_revoked.connect
def end_revoked(request=None, terminated=False, expired=False, **kwargs):
    """`expired`: the worker received it after its queue deadline. `terminated`: a cancel signalled the pool
    process running it (the row already says cancelled); its leases go back once that process has exited
    (`release_when_gone`). Otherwise it was revoked before it started."""
    call_id = getattr(request, 'id', None)
    if not call_id:
        return
    try:
        drop_broken_connections()  # the main process's own connection: no task_prerun runs here
        if terminated:
            release_when_gone(call_id)
        else:
            lifecycle.end_unstarted(call_id, State.EXPIRED if expired else State.CANCELLED)
    except Exception:  # noqa: BLE001 - never break the worker's main loop; the leases expire on their own
        logger.exception('Could not end revoked heavy call %s', call_id)


STOP_POLL_SECONDS = 0.05


def process_gone(pid):
    """Whether the process `pid` has exited (a zombie not yet reaped by its parent has)."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def release_when_gone(call_id, seconds=None):
    """Celery sends task_revoked(terminated) as it signals the pool process, not once that process has
    exited: the work may still run (a signal waits for a C call to return, or the process outlives it). A
    cancel that released the leases then answered `cancelled` while the call ran on, uncounted. So the
    call is marked stopped and its leases released (`lifecycle.stopped`) once that process is gone; if it
    lives on, its run ends the call itself (its heartbeat stops the work). Waits on a thread, for at most
    `seconds` (lease_seconds): the main loop must not. Returns the thread, or None when there is nothing
    to wait for (another delivery runs the call now, or it already stopped)."""
    work = Work.objects.filter(pk=call_id).only('state', 'worker', 'heartbeat_at').first()
    if work is None or work.state != State.CANCELLED or work.heartbeat_at is None:
        return None
    node, _, pid = work.worker.rpartition(' pid ')
    if node != (_node[0] if _node else '') or not pid.isdigit():
        return None  # it runs on another node, which ends it
    seconds = seconds if seconds is not None else get_config().lease_seconds
    thread = threading.Thread(target=_stopped_once_gone, args=(call_id, int(pid), seconds),
                              name=f'heavy-lanes-stop-{call_id[:8]}', daemon=True)
    thread.start()
    return thread


def _stopped_once_gone(call_id, pid, seconds):
    deadline = time.monotonic() + seconds
    try:
        looks = 0
        while not process_gone(pid):
            looks += 1
            if time.monotonic() >= deadline or (looks % 20 == 0 and not Work.objects.filter(
                    pk=call_id, heartbeat_at__isnull=False).exists()):
                return  # its run ended it, or will: its heartbeat stops the work
            time.sleep(STOP_POLL_SECONDS)
        with fork_guard:  # database and Redis clients: not while the pool forks a new process
            lifecycle.stopped(call_id)
    except Exception:  # noqa: BLE001 - the leases expire on their own
        logger.exception('Could not end terminated heavy call %s', call_id)
    finally:
        connection.close()


_bound = []  # the request id bound by task_prerun in this pool process (one task at a time)


@worker_process_init.connect
def forget_parent_database_connections(**kwargs):
    forget_inherited_connections()


@worker_process_init.connect
def yield_to_requests(**kwargs):
    """A pool process of a node that serves only bulk lanes (es2_knn, api_heavy) runs at niceness
    WORKERS_BULK_NICENESS (default 10): where the API and the workers share cores (`make run`, a small
    host), the API's requests and a person's single-row call (the interactive lane, left at 0) get a core
    first, and the bulk work still has every cycle they leave (the flood at 32 bulk users: the requests'
    medians a third lower, bulk rows/s no lower; docs/benchmarks.md). The node's main process (the consumer,
    the reconciler) keeps its priority. A call's heartbeat thread runs in the niced process: CFS still gives
    it a share every scheduling period, far inside the `lease_seconds` a beat may be late."""
    niceness = settings.WORKERS_BULK_NICENESS
    if niceness <= 0 or not _served or any(lanes.get_queue(name).single_row for name in _served):
        return
    try:
        os.nice(niceness)
    except OSError as ex:
        logger.warning('Pool process %s could not lower its priority: %s', os.getpid(), ex)


@worker_process_init.connect
def make_result_backend(**kwargs):
    """Build this pool process's result backend (workers.lifecycle stores a call's result through it) now,
    not in its first call: finding its class scans the installed packages' entry points and imports
    django-celery-results, 15 ms of the first call's 75. No I/O: it connects at its first use."""
    from workers.celery import app
    try:
        app.backend  # noqa: B018 - the property builds the process's backend
    except Exception as ex:  # noqa: BLE001 - the first call builds it then, as without this
        logger.warning('Pool process %s could not build its result backend yet: %s', os.getpid(), ex)


@task_prerun.connect
def drop_broken_database_connections(**kwargs):
    drop_broken_connections()


@task_prerun.connect
def bind_request_id(task=None, **kwargs):
    _bound.append(request_id.bind(getattr(getattr(task, 'request', None), 'request_id', None)))


@task_postrun.connect
def unbind_request_id(**kwargs):
    while _bound:
        request_id.unbind(_bound.pop())


@task_failure.connect
def end_timed_out(task_id=None, exception=None, **kwargs):
    """The hard time limit: sent in the main process after it killed the pool process. (Other failures
    are sent in the pool process, where workers.execution already recorded them.)"""
    if not task_id or not isinstance(exception, TimeLimitExceeded):
        return
    seconds = exception.args[0] if exception.args else '?'
    try:
        drop_broken_connections()
        lifecycle.time_out(task_id, seconds, _node[0] if _node else '')
    except Exception:  # noqa: BLE001 - never break the worker's main loop; the leases expire on their own
        logger.exception('Could not end timed-out heavy call %s', task_id)


_reconciler = None
_slots = []  # the SlotKeeper of this node's main process (workers.slots)
_served = []  # the queues this node was started for (-Q), whether it consumes them now or not
_node = []    # this worker's node name ('<queue>@<host>')


@celeryd_after_setup.connect
def skip_paused_queues(sender=None, instance=None, **kwargs):
    """Don't start consuming a queue whose pool size is 0: a call it took would run in a paused lane."""
    queues = instance.app.amqp.queues
    _node[:] = [sender]
    _served[:] = [name for name in (queues.consume_from or {}) if name in lanes.QUEUE_NAMES]
    try:
        config = get_config()
    except Exception:  # noqa: BLE001 - the reconciler sizes the pool once it can read the config
        return
    for name in _served:
        if lanes.get_queue(name).pool_size(config) == 0:
            queues.deselect(name)
            logger.info('Queue %s is paused: %s starts without consuming it', name, sender)


@celeryd_after_setup.connect
def warm_indexes(sender=None, **kwargs):
    """Load the match indexes in the main process, before the pool forks, so no call pays for them.
    A failure here costs only the warm start: the calls load what they need, as without it.

    Then `gc.freeze()`: what is loaded by now (the indexes, the libraries) is never scanned by the garbage
    collector again, here or in a pool process. A full collection walked all of it, 37–46 ms for the HPO
    indexes, and in a forked process it also wrote to every object's pages, copying them (copy-on-write):
    a node's calls queued behind such pauses (bench/latency.py's slowest calls, a few seconds into its
    run, waited 0.3–0.7 s to be received)."""
    if not _served:
        return
    from concepts import services
    started = time.monotonic()
    try:
        parts = services.warm(semantic=any(lanes.get_queue(name).semantic is not False for name in _served),
                              lexical=any(lanes.get_queue(name).semantic is not True for name in _served))
    except Exception as ex:  # noqa: BLE001 - the worker starts cold rather than not at all
        logger.warning('%s starts without its match indexes loaded: %s', sender, ex)
        return
    gc.freeze()
    logger.info('%s loaded %d match index parts in %.2f s', sender, parts, time.monotonic() - started)


@worker_ready.connect
def start_reconciler(sender=None, **kwargs):
    """Start sizing this node's pools once the worker consumes (prefork workers only)."""
    global _reconciler
    consumer = sender
    queues = list(_served) or list(consumer.app.amqp.queues.consume_from or {})
    if not any(queue in lanes.QUEUE_NAMES for queue in queues):
        return
    if type(consumer.pool).__module__ != 'celery.concurrency.prefork':
        logger.warning('Pools are sized only on the prefork pool; %s is left as started', consumer.hostname)
        return
    _reconciler = PoolReconciler(consumer.app, consumer, consumer.hostname, queues)
    _reconciler.start()
    _slots.append(SlotKeeper(consumer.hostname).start())  # the calls its pool runs stay counted


@worker_shutdown.connect
def stop_reconciler(**kwargs):
    if _reconciler is not None:
        _reconciler.stop()
    for keeper in _slots:
        keeper.stop()
