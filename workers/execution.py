"""Run one admitted heavy call in a worker, with its leases handed over from the API.

A plain function, callable and testable without a broker (workers.tasks wraps it in the Celery task). It
applies what workers.lifecycle decides and never writes a call's state itself:

1. load the row (the API commits it right after publishing) and ask `lifecycle.start` to claim it: an
   expired call is ended unrun, a cancelled or finished one skipped, a duplicate of a call that runs
   elsewhere dropped;
2. renew its leases (all or nothing; a redelivered call takes them again: it was admitted once) — from
   then on a dead worker's leases expire within lease_seconds;
3. keep a heartbeat thread: it renews the leases every renew_seconds (up to max_hold_seconds) and beats
   the row, which is how a later delivery tells a live run from a dead one;
4. run the domain work; release the leases; record the end with `lifecycle.succeed` or `lifecycle.fail`.

A lost lease is logged and never stops the work.
"""
import logging

from django.db import connection

from capacity import failopen
from capacity.config import get_config
from capacity.lease import LeaseRenewer
from workers import lifecycle, work
from workers.models import State

logger = logging.getLogger('heavy_lanes')


def run(call_id, perform=None, node=''):
    """Run the call `call_id` and return its result (None when it was skipped). A failure is recorded and
    re-raised."""
    perform = perform or work.perform
    call = lifecycle.load(call_id)
    if call is None:
        logger.warning('Heavy call %s has no row: its submission never committed; dropped', call_id)
        return None
    worker = lifecycle.worker_name(node)
    start = lifecycle.start(call, worker)
    if start.kind == lifecycle.EXPIRE:
        lifecycle.end_unstarted(call.pk, State.EXPIRED)
        return None
    if start.kind == lifecycle.BUSY:
        logger.warning('Heavy call %s already runs on %s; this delivery is a duplicate and is dropped',
                       call.pk, call.worker)
        return None
    if start.kind != lifecycle.RUN:
        return None  # cancelled (or already finished) before it started: its leases were released then

    config = get_config()
    admission = lifecycle.admission_of(call)
    lease = admission.worker_lease(config['lease_seconds'] * 1000)
    if lease.holding and not lease.renew():
        if not (start.redelivered and lease.retake(admission.worker_limits())):
            lease.lease_lost = True
            logger.warning('Heavy call %s runs without its leases (lease_lost)', call.pk)
    heartbeat = start_heartbeat(call, worker, lease, config)
    try:
        result = perform(call)
    except Exception as ex:
        finish(call, lease, heartbeat)
        if not lifecycle.fail(call, f'{type(ex).__name__}: {ex}', worker=worker):
            lifecycle.stopped(call.pk)
        raise
    finish(call, lease, heartbeat)
    if not lifecycle.succeed(call, result, worker=worker):
        lifecycle.stopped(call.pk)  # cancelled while it ran: no result is kept
    return result


def start_heartbeat(call, worker, lease, config):
    """Renew the leases and beat the row every renew_seconds while the call runs; None if it can't start.

    A heartbeat that can't start (no thread to be had) never stops the call: it runs on, and its leases
    expire lease_seconds after the renewal at its start.
    """
    heartbeat = LeaseRenewer(lease, config['renew_seconds'], config['max_hold_seconds'],
                             on_tick=lambda: lifecycle.beat(call, worker), on_exit=close_connection)
    try:
        heartbeat.start()
    except Exception as ex:  # noqa: BLE001 - fail open, like every limiter error
        failopen.record(lease, ex, 'heartbeat start')
        return None
    return heartbeat


def close_connection():
    """Close this thread's database connection (the heartbeat's own, opened by its first beat)."""
    connection.close()


def finish(call, lease, heartbeat):
    """Stop the heartbeat and release the leases; keep what the limiter met for the log line."""
    if heartbeat is not None:
        heartbeat.stop()
    lease.release()
    lifecycle.note_limiter(call, lease)
