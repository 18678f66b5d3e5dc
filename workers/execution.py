"""Run one admitted heavy call's work in a worker, with its leases handed over from the API.

A plain function, callable and testable without a broker (workers.tasks wraps it in the Celery task). It
applies what workers.lifecycle decides and never writes a work's state itself:

1. load the work with its first call (the API commits them right after publishing), renew a queued work's
   leases to the worker's lease_seconds, and ask `lifecycle.start` to claim it: an expired work is ended
   unrun, a cancelled or finished one skipped; a message of a work that runs on a live worker raises Busy
   (the task looks at it again later: a duplicate, or a redelivery from a dying worker). A first delivery
   whose message carries its leases renews them first and claims the row with its read, in one statement,
   where the database can (`lifecycle.claim_first`): one round trip less on the path every queued work
   waits behind;
2. renew its leases (all or nothing; a redelivered work takes them again: it was admitted once) — from
   then on a dead worker's leases expire within lease_seconds;
3. keep a heartbeat thread: it beats the row every WORKERS_HEARTBEAT_SECONDS (how a later delivery tells a
   live run from a dead one) and renews the leases every renew_seconds (up to max_hold_seconds). A beat
   that finds the work no longer its own (cancelled, and Celery's revoke didn't reach the process) stops
   it;
4. run the domain work; record the end with `lifecycle.succeed` or `lifecycle.fail`; release the leases —
   unless another delivery took the work over, which holds them now; end it (its calls' log lines).

A lost lease is logged and never stops the work. A work still running at its soft time limit
(capacity.config.time_limits, sent with its message) gets Celery's SoftTimeLimitExceeded, which ends it
`failed` like any error, with a message that says it was stopped by its time limit; one that ignores it is
killed at the hard limit, and the worker's main process ends it (workers.signals).
"""
import ctypes
import logging
import os
import queue
import signal
import threading
import time
from contextlib import contextmanager

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection
from rest_framework.exceptions import ValidationError

from capacity import failopen, logs
from capacity.admission import lease_from_message
from capacity.config import get_config
from capacity.lease import LeaseRenewer
from common import request_id
from common.database import DATABASE_DOWN, drop_broken_connections
from workers import lifecycle
from workers import work as domain
from workers.models import State

logger = logging.getLogger('heavy_lanes')


class Busy(Exception):
    """Another worker runs the work now: look at this message again in `retry_in` seconds."""

    def __init__(self, work_id, worker, retry_in):
        super().__init__(f'Heavy work {work_id} runs on {worker}; this delivery waits {retry_in:.0f} s')
        self.retry_in = retry_in


class CallStopped(BaseException):
    """Raised inside the work of a call that is no longer this worker's (a BaseException, so the domain
    code's `except Exception` doesn't swallow it)."""


class Running:
    """The domain work of one run, on the thread that runs it, and a way to stop it from another thread.

    Written by hand because nothing in Celery stops a task from inside its own process on demand (revoke
    with terminate kills the process from the worker's main process); CPython's PyThreadState_SetAsyncExc
    raises an exception in the running thread at its next bytecode.
    """

    def __init__(self):
        self.thread = threading.get_ident()
        self.lock = threading.Lock()
        self.running = False
        self.stop_asked = False

    def run(self, perform, work):
        with self.lock:
            self.running = True
        try:
            return perform(work)
        finally:
            with self.lock:
                self.running = False
                if self.stop_asked:
                    # A stop asked for just as the work returned may still be pending: clear it.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread), None)

    def stop(self):
        """Stop the work if it still runs; True when a stop was sent."""
        with self.lock:
            if not self.running or self.stop_asked:
                return False
            self.stop_asked = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread), ctypes.py_object(CallStopped))
            return True


def run(work_id, perform=None, node='', soft_limit=None, leases=None, notice_to=None):
    """Run the work `work_id` and return its result (None when it was skipped or stopped). A failure is
    recorded and re-raised. `soft_limit` is the message's soft time limit in seconds (for the error);
    `leases`, the worker leases its message carries (Admission.worker_lease_message), if it does;
    `notice_to`, the notice channel of the API process whose request waits for it (notify.reply_to)."""
    perform = perform or domain.perform
    config = get_config()
    early = lease_from_message(leases, config.lease_seconds * 1000) if leases is not None else None
    if early is not None and lifecycle.claim_first_available():
        # The rows are read with the claim, in one statement; the leases are renewed before, as below.
        renewed = early.renew()
        first = lifecycle.claim_first(work_id, lifecycle.worker_name(node))
        if first is not None:
            first.work.notice_to = notice_to if isinstance(notice_to, str) else None
            with request_id.bound(first.request_id or request_id.get()):
                return run_loaded(first, perform, node, soft_limit, claimed=(early, renewed))
    first = lifecycle.load(work_id)
    if first is None:
        logger.warning('Heavy work %s has no row: its submission never committed; dropped', work_id)
        return None
    first.work.notice_to = notice_to if isinstance(notice_to, str) else None
    with request_id.bound(first.request_id or request_id.get()):  # the row's id is the truth
        return run_loaded(first, perform, node, soft_limit)


def run_loaded(first, perform, node, soft_limit, claimed=None):
    """Run the work of `first` (its first call, as loaded, with `first.work`); `claimed`: (lease, renewed)
    when lifecycle.claim_first claimed it already, with the lease its message carried, renewed just before
    the claim."""
    work = first.work
    worker = lifecycle.worker_name(node)
    config = get_config()
    if claimed is not None:
        (lease, renewed), early = claimed, claimed[0].holding
        start = lifecycle.Start(lifecycle.RUN)
    else:
        lease = lifecycle.worker_lease(work, config.lease_seconds * 1000)
        # A queued work's leases last until its queue deadline. Shorten them to the worker's before the row
        # says running: a node lost between the two then leaves them for lease_seconds, not for the
        # deadline. (Should the work not start here after all, its leases are released or renewed where it
        # ends or runs.)
        early = lease.holding and work.state == State.QUEUED
        renewed = lease.renew() if early else False
        start = lifecycle.start(work, worker)
    if start.kind == lifecycle.EXPIRE:
        lifecycle.end_unstarted(work.pk, State.EXPIRED)
        return None
    if start.kind == lifecycle.BUSY:
        raise Busy(work.pk, work.worker, start.retry_in)
    if start.kind != lifecycle.RUN:
        return None  # cancelled (or already finished) before it started: its leases were released then

    running = Running()
    heartbeat = None
    began = None
    run_line = RunLine(work, worker)
    try:  # from here on the work is ours: whatever stops it (its soft time limit too) ends it here
        if lease.holding and not renewed and (early or not lease.renew()):
            if not (start.redelivered and lease.retake(work.lease.get('limits') or [])):
                lease.lease_lost = True
                logger.warning('Heavy work %s runs without its leases (lease_lost)', work.pk)
        heartbeat = start_heartbeat(work, worker, lease, config, running)
        began = time.monotonic()
        try:
            result = running.run(perform, work)
        finally:
            run_line.ended()
    except CallStopped:
        with terminate_deferred() as ending:
            ending.cancelled = True
            end(first, worker, lease, heartbeat, recorded=False)
        return None
    except Exception as ex:
        with terminate_deferred() as ending:
            ran = ran_for(work, began)
            error = describe(ex, soft_limit or config.max_hold_seconds)
            recorded = record(heartbeat, lifecycle.fail, work, error, worker=worker)
            ending.cancelled = not recorded
            end(first, worker, lease, heartbeat, recorded=recorded, ran=ran)
        if recorded:
            raise
        # Not this run's failure to report: the work was cancelled or taken over by another delivery.
        logger.info('Heavy work %s stopped with %s after it was cancelled or taken over', work.pk,
                    type(ex).__name__)
        if swallowed_exit(ex):
            # The cancel's SIGTERM (billiard's handler raises SystemExit) met an import of a C extension,
            # which turned it into this error and left the module half registered: the process would fail
            # every later call that imports it. It exits now, as the signal meant, and the pool replaces it.
            raise SystemExit(-signal.SIGTERM) from ex
        return None
    with terminate_deferred() as ending:
        ran = ran_for(work, began)
        text = record(heartbeat, lifecycle.succeed, work, result, worker=worker)
        ending.cancelled = text is None
        end(first, worker, lease, heartbeat, recorded=text is not None, ran=ran, result_text=text)
    return result


class RunLine:
    """The two log lines of one run of a work: `started` when this delivery claimed it, `ended` when its
    computation stopped (returned, raised, or was stopped by a cancel), before its end is recorded. Each
    carries `run`: the work, the run's number (the row's `attempts` after the claim), the worker, the claim's
    time by the database's clock (`started`, the row's `started_at`, which a later run overwrites) and, on
    the end, the seconds it ran by this host's monotonic clock: two runs of one work on two hosts compare
    on one clock whatever each host's says. A run with a start and no end died with its process.
    docs/cluster.md judges "no work runs twice at once" by these."""

    def __init__(self, work, worker):
        self.run = {'work': work.pk, 'attempt': work.attempts, 'worker': worker,
                    'started': work.started_at.isoformat() if work.started_at else None}
        self.clock = time.monotonic()
        logger.info('Heavy work %s: run %s started on %s', work.pk, work.attempts, worker,
                    extra={'run': self.run})

    def ended(self):
        seconds = round(time.monotonic() - self.clock, 3)
        logger.info('Heavy work %s: run %s ended after %.3f s', self.run['work'], self.run['attempt'], seconds,
                    extra={'run': {**self.run, 'seconds': seconds}})


def swallowed_exit(ex):
    """Whether `ex` was raised while a SystemExit was being handled (its cause or context, at any depth)."""
    seen = set()
    while ex is not None and id(ex) not in seen:
        if isinstance(ex, SystemExit):
            return True
        seen.add(id(ex))
        ex = ex.__cause__ or ex.__context__
    return False


RECORD_PAUSE_SECONDS = (0.2, 5.0)  # the first and the longest pause between tries to record an end
RECORD_PATIENCE_SECONDS = None  # how long to try; None: the config's lease_seconds


def record(heartbeat, write, *args, **kwargs):
    """Record the work's end with `write`, trying again while the database can't take it (a restart, a
    failover, a read-only spell) for up to `patience` seconds (lease_seconds): the work is done, and its
    result, kept here in memory, is worth the wait: given up, the task sends its message again and the
    next delivery computes it a second time. Meanwhile the heartbeat goes on (its leases stay renewed, and
    its beats, which fail too, start again with the database). When it fails for good, stop the heartbeat
    first: the work is over, and a row still beaten would make every later delivery wait for a live worker
    (Busy) until max_hold_seconds. The leases are left as they are: they expire lease_seconds after the
    last renewal, and the delivery that takes over once the heartbeat is stale retakes them."""
    patience = RECORD_PATIENCE_SECONDS if RECORD_PATIENCE_SECONDS is not None else get_config().lease_seconds
    deadline = time.monotonic() + patience
    pause = RECORD_PAUSE_SECONDS[0]
    while True:
        try:
            return write(*args, **kwargs)
        except DATABASE_DOWN as ex:
            if time.monotonic() + pause < deadline:
                logger.warning('The end of a heavy work could not be recorded (%s: %s); trying again in %.1f s',
                               type(ex).__name__, ex, pause)
                drop_broken_connections()
                time.sleep(pause)
                pause = min(pause * 2, RECORD_PAUSE_SECONDS[1])
                continue
            if heartbeat is not None:
                heartbeat.stop()
            raise
        except BaseException:
            if heartbeat is not None:
                heartbeat.stop()
            raise


class Ending:
    cancelled = False  # the call was cancelled while it ran: the cancel's terminate signal is on its way


@contextmanager
def terminate_deferred():
    """Hold a SIGTERM back until the block ends, then take it as it would have been taken.

    A cancel of a running call sends its pool process SIGTERM (Celery's revoke with terminate), which kills
    it at once: right while the work runs, that is the point. But the same cancel makes the run's own end
    find the call cancelled, so a quick call is often in its end (recording it, releasing its leases,
    writing its line: workers.lifecycle.stopped) when the signal lands, and a process killed there left the
    call half ended: no line, and leases nobody released. The work is over by then; only the bookkeeping is
    left, and it is short. Before the signal is taken, or when one is on its way (`Ending.cancelled`), the
    log lines of the end are written out: a daemon thread writes them (capacity.logs), and the signal
    would kill it with them queued. Python handles a signal on the main thread, where a prefork pool runs
    its tasks; elsewhere (a thread pool in tests) nothing is held back.
    """
    ending = Ending()
    if threading.current_thread() is not threading.main_thread():
        yield ending
        return
    held = []
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    except (ValueError, OSError):  # no signals here (not the main interpreter)
        yield ending
        return
    try:
        yield ending
    finally:
        signal.signal(signal.SIGTERM, previous)
        if held or ending.cancelled:
            logs.drain(LOG_DRAIN_SECONDS)
        if held:
            os.kill(os.getpid(), signal.SIGTERM)  # what it would have done, now that the end is whole


LOG_DRAIN_SECONDS = 0.5


def ran_for(work, began):
    """(queue, ms) of a run that began at `began` (time.monotonic()) and ended now, None if it never began:
    what the release measures as the queue's run time (the poll hints read it)."""
    if began is None:
        return None
    return work.queue, int((time.monotonic() - began) * 1000)


def describe(ex, soft_limit):
    """The Failure of a call that raised `ex`: a bad body is the in-request endpoint's 400 naming the field,
    a time limit a 504, anything else a 500."""
    if isinstance(ex, SoftTimeLimitExceeded):
        return lifecycle.Failure.time_limit(lifecycle.SOFT_LIMIT.format(seconds=soft_limit))
    if isinstance(ex, ValidationError):
        return lifecycle.Failure.invalid(ex.detail)
    return lifecycle.Failure.internal(f'{type(ex).__name__}: {ex}')


def start_heartbeat(work, worker, lease, config, running):
    """Beat the row and renew the leases while the call runs; None if no thread can be started.

    A heartbeat that can't start never stops the call: it runs on, and its leases expire lease_seconds
    after the renewal at its start.
    """
    def beat():
        if not lifecycle.beat(work, worker) and running.stop():
            logger.warning('Heavy work %s is no longer this worker\'s (cancelled?): it is stopped', work.pk)

    heartbeat = LeaseRenewer(lease, config.renew_seconds, config.max_hold_seconds,
                             tick=min(settings.WORKERS_HEARTBEAT_SECONDS, config.renew_seconds),
                             on_tick=beat, on_exit=close_connection)
    try:
        BEATS.start(heartbeat)
    except SoftTimeLimitExceeded:
        raise  # the call's time is up, not the limiter's problem
    except Exception as ex:  # noqa: BLE001 - fail open, like every limiter error
        lease.error = failopen.record(ex, 'heartbeat start')
        return None
    return heartbeat


class Beats:
    """This pool process's heartbeat thread, kept from one call to the next.

    A thread started and joined for every call cost the worker about 1.5 ms of each call's handoff under
    load (`Thread.start` waits for the new thread to run, `join` for it to end), paid by every call queued
    behind the process. One thread runs each call's LeaseRenewer loop in turn (its `run`, on this thread
    instead of its own): a stopped loop returns at its next wait, at once. A renewer gets a thread of its
    own as before when the last loop is still busy: another call runs in this process at the same time (a
    thread pool), or the last one, though stopped, hasn't returned within HANDOVER_SECONDS (a renewal or a
    beat stuck on a stalled Redis or database). Made again after a fork (a pool process inherits no
    thread).
    """
    HANDOVER_SECONDS = 0.05

    def __init__(self):
        self.lock = threading.Lock()
        self.pid = None
        self.jobs = None
        self.thread = None
        self.current = None
        self.free = threading.Event()

    def start(self, renewer):
        with self.lock:
            if self.pid != os.getpid() or self.thread is None or not self.thread.is_alive():
                jobs, free = queue.SimpleQueue(), threading.Event()
                thread = threading.Thread(target=self.serve, args=(jobs, free), name='heavy-lanes-heartbeat',
                                          daemon=True)
                thread.start()
                self.pid, self.jobs, self.thread, self.free, self.current = os.getpid(), jobs, thread, free, None
                free.set()
            if self.free.is_set():
                own = False
            elif not self.current.finished.is_set():
                own = True  # another call's loop, still running
            else:
                own = not self.free.wait(self.HANDOVER_SECONDS)
            if own:
                renewer.start()
                return
            self.free.clear()
            self.current = renewer
            self.jobs.put(renewer)

    def serve(self, jobs, free):
        while True:
            renewer = jobs.get()
            try:
                renewer.run()
            except Exception:  # noqa: BLE001 - one call's heartbeat must not end the next ones'
                logger.exception("Heartbeat thread: a call's renewer failed")
            finally:
                free.set()

    def idle(self):
        return self.free.is_set()


BEATS = Beats()


def close_connection():
    """Close this thread's database connection (the heartbeat's own, opened by its first beat)."""
    connection.close()


def end(first, worker, lease, heartbeat, recorded, ran=None, result_text=None):
    """After the work: stop the heartbeat, give the leases back and end it (`first`: its first call).

    `recorded`: lifecycle recorded this run's end. When it didn't, the work was cancelled while it ran (it
    has now stopped: `lifecycle.stopped`), or another delivery took it over, which holds its leases.
    `ran`: (queue, ms) of a run that ended by itself, which the release measures; `result_text`: the
    stored result's text of a success (its notice may carry it).
    """
    work = first.work
    if heartbeat is not None:
        heartbeat.stop()
    if not recorded and lifecycle.taken_over(work, worker):
        logger.warning('Heavy work %s was taken over by another delivery; this run ends without a trace', work.pk)
        return
    if recorded:
        lifecycle.end_with_release(work, lease, ran=ran, result_text=result_text, first=first)
    elif not lifecycle.stopped(work.pk, lease):
        # Cancelled while it ran, and the work has stopped: the row says so before the leases go back
        # (lifecycle.stopped), never after. Already marked stopped by someone else: a release is harmless.
        lease.release()
