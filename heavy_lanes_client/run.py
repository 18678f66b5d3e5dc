"""A run: many rows sent as batches of heavy calls, with at most as many calls in flight as the server
suggests, every row accounted for at the end.

    run = Run.match(client, rows, source='/orgs/HPO/sources/HPO/', semantic=True, batch_size=25,
                    max_concurrency=4)
    report = run.execute()        # RunReport: summary + one RowOutcome per row, in input order

How it behaves:
- Each batch is one call with its own Idempotency-Key (`hl-<run_id>-<batch>`), reused on every retry, so
  a call the server took before a connection dropped is answered with its first handle, never run twice.
  Running again with the same `run_id` (and the same rows and batch size) picks up the earlier tasks.
- A call holds a slot from its first send until its task ends. The number of slots starts at
  `initial_concurrency` (1) and follows `X-OCL-Capacity-Suggested-Concurrency` on every answer, never
  above `max_concurrency`; when the server counts nothing (no capacity headers on a first answer: the
  limiter is off, or a lexical call), it is `max_concurrency`.
- A 429 is waited out per RetryPolicy (Retry-After plus jitter, bounded), and no other call of the run is
  sent before that time either. Capacity refusals, rate limits, server errors and dropped connections are
  counted apart. 5xx and dropped connections are retried with backoff, same key.
- Tasks are long-polled (`GET /tasks/<id>/?wait=N`), pausing for the server's Retry-After hint.
- A row is `no_match` only when its task succeeded and returned no candidates for it; anything else
  that went wrong makes it `failed` with the reason (and the task id / key to look it up).
- A 400 that concerns every batch (bad source, bad limit) or a 401/403 stops the run: the remaining
  batches are not sent and their rows fail with that reason.
- Ctrl-C (KeyboardInterrupt in execute()) or `cancel()`: no more sends, DELETE for every task still in
  flight, rows of cancelled tasks fail as "cancelled". After Ctrl-C execute() raises RunInterrupted with
  the report; after cancel() from another thread it returns the report with `interrupted` set.

This module holds the orchestration: slots, a thread per call, polling, cancel. What a batch is and what
its rows became is the job's (jobs), sending one call with its retries the Sender's (sender), and the
counts and the report the Tally's (tally).
"""
import random
import threading
import time
import uuid
from dataclasses import dataclass

from heavy_lanes_client import errors
from heavy_lanes_client.concurrency import AdaptiveLimit
from heavy_lanes_client.jobs import MatchJob, RerankJob
from heavy_lanes_client.models import RowStatus, State
from heavy_lanes_client.progress import Snapshot
from heavy_lanes_client.retry import RetryPolicy, Stopped
from heavy_lanes_client.sender import Sender
from heavy_lanes_client.tally import Tally

MAX_RUN_ID = 200  # the key `hl-<run_id>-<batch>` must stay within the API's 255 characters
INTERRUPTED = 'run interrupted'


@dataclass(frozen=True)
class PollPolicy:
    long_poll_seconds: int = 20          # ?wait=N per poll (the server caps it)
    task_timeout_seconds: float = 1800.0  # then the task is cancelled and its rows fail
    max_poll_errors: int = 8             # transient poll failures in a row before giving up on a task


class Run:
    """Runs a job's batches through a Client; see the module docstring. Execute once."""

    def __init__(self, client, job, *, max_concurrency=4, initial_concurrency=1, retry=None, poll=None,
                 progress=None, run_id=None, sleep=None, rng=None, clock=time.monotonic,
                 cancel_grace_seconds=5.0):
        if max_concurrency < 1:
            raise ValueError('max_concurrency must be at least 1')
        if run_id is not None and not (0 < len(run_id) <= MAX_RUN_ID and run_id.isprintable()):
            raise ValueError(f'run_id must be 1..{MAX_RUN_ID} printable characters')
        self.client = client
        self.job = job
        self.retry = retry or RetryPolicy()
        self.poll = poll or PollPolicy()
        self.progress = progress
        self.run_id = run_id or uuid.uuid4().hex
        self.rng = rng or random.Random()
        self.clock = clock
        self.cancel_grace_seconds = cancel_grace_seconds
        self.max_concurrency = max_concurrency
        self._sleep = sleep or (lambda seconds, stop: stop.wait(seconds))
        self._batches = job.batches()
        self._limit = AdaptiveLimit(initial_concurrency, max_concurrency)
        self._stop = threading.Event()
        self._cancelled = threading.Event()  # set when cancel() has dealt with every task it took
        self._lock = threading.Lock()
        self._tally = Tally(clock)
        self._open = {}              # batch index -> Handle whose task has not ended
        self._cancel_owned = set()   # batches whose tasks cancel() took over
        self._dispatched = set()
        self._fatal = None
        self._sender = Sender(client, job, self.retry, tally=self._tally, limit=self._limit, stop=self._stop,
                              sleep=self._sleep, rng=self.rng, clock=clock, run_id=self.run_id)
        self._threads = []
        self._interrupted = False
        self._executed = False
        self._started_at = None

    @classmethod
    def match(cls, client, rows, source, *, semantic=True, reranker=False, limit=5, batch_size=25, **options):
        return cls(client, MatchJob(rows, source, semantic=semantic, reranker=reranker, limit=limit,
                                    batch_size=batch_size), **options)

    @classmethod
    def rerank(cls, client, queries, candidates, **options):
        return cls(client, RerankJob(queries, candidates), **options)

    @property
    def total_rows(self):
        return sum(len(batch.items) for batch in self._batches)

    @property
    def limit(self):
        """The number of calls the run may have in flight now."""
        return self._limit.limit

    def key_for(self, batch):
        return f'hl-{self.run_id}-{batch.index}'

    # --- running ---------------------------------------------------------------------------------

    def execute(self):
        """Send every batch and wait for all; return the RunReport. Ctrl-C: RunInterrupted(report)."""
        if self._executed:
            raise RuntimeError('a Run executes once')
        self._executed = True
        self._started_at = self.clock()
        if self.progress is not None:
            self.progress.start(self.snapshot)
        try:
            try:
                self._dispatch()
                self._join()
            except KeyboardInterrupt:
                self._interrupted = True
                self.cancel()
                self._join()
                raise errors.RunInterrupted(self._report()) from None
            return self._report()
        finally:
            if self.progress is not None:
                self.progress.close()

    def cancel(self):
        """Stop sending, and cancel (DELETE) every task in flight; their rows fail as cancelled."""
        self._interrupted = True
        try:
            self._stop.set()
            with self._lock:
                owned = dict(self._open)
                self._open.clear()
                self._cancel_owned.update(owned)
            for index, handle in owned.items():
                self._cancel_and_record(self._batches[index], handle, INTERRUPTED)
        finally:
            self._cancelled.set()

    def _dispatch(self):
        for batch in self._batches:
            if self._stop.is_set() or self._fatal is not None:
                return
            if not self._limit.acquire(self._stop):
                return
            if self._fatal is not None:
                self._limit.release()
                return
            thread = threading.Thread(target=self._process, args=(batch,), daemon=True,
                                      name=f'heavy-lanes-batch-{batch.index}')
            self._dispatched.add(batch.index)
            self._threads.append(thread)
            thread.start()

    def _join(self):
        """Wait until every batch's thread has recorded its rows, and so has a cancel() running in another
        thread; once stopping, wait at most `cancel_grace_seconds` more."""
        deadline = None

        def out_of_time():
            nonlocal deadline
            if not self._stop.is_set():
                return False
            if deadline is None:
                deadline = self.clock() + self.cancel_grace_seconds
            return self.clock() >= deadline

        for thread in list(self._threads):
            while thread.is_alive() and not out_of_time():
                thread.join(0.1)
        if self._stop.is_set():  # the tasks cancel() took are recorded by cancel(), maybe in another thread
            while not self._cancelled.is_set() and not out_of_time():
                self._cancelled.wait(0.1)

    def _process(self, batch):
        key = self.key_for(batch)
        handle = None
        try:
            handle = self._sender.send(batch, key)
            task = handle.immediate
            if task is not None:
                self._tally.record(batch, self.job.outcomes(batch, task, key), task.state)
                return
            with self._lock:
                stopping = self._stop.is_set()
                if not stopping:
                    self._open[batch.index] = handle
            if stopping:  # answered after cancel() looked: cancel it here
                self._cancel_and_record(batch, handle, INTERRUPTED)
                return
            task = self.client.wait(handle, timeout=self.poll.task_timeout_seconds,
                                    long_poll=self.poll.long_poll_seconds,
                                    sleep=lambda seconds: self._sleep(seconds, self._stop),
                                    max_errors=self.poll.max_poll_errors, clock=self.clock,
                                    on_task=lambda seen: self._tally.running(batch, seen.rows_done))
            with self._lock:
                if batch.index in self._cancel_owned:
                    return  # cancel() records it
                self._open.pop(batch.index, None)
            if not task.finished:
                why = INTERRUPTED if self._stop.is_set() else (
                    f'timed out after {self.poll.task_timeout_seconds:g} s waiting for the task '
                    f'({task.state})')
                self._cancel_and_record(batch, handle, why)
                return
            self._tally.record(batch, self.job.outcomes(batch, task, key), task.state)
        except Stopped as ex:
            reason = (f'{INTERRUPTED} while resending a call the server may have taken '
                      f'(Idempotency-Key {key})' if ex.uncertain else f'not submitted: {INTERRUPTED}')
            self._tally.record(batch, self.job.failed(batch, reason, key))
        except errors.ClientError as ex:
            if self._owned_by_cancel(batch):
                return
            # A paused lane stays paused for every batch: the others are not sent either.
            if handle is None and (isinstance(ex, errors.LanePaused) or (
                    isinstance(ex, errors.RequestRejected) and self.job.is_fatal(ex))):
                with self._lock:
                    self._fatal = self._fatal or ex
            task_id = handle.id if handle is not None else None
            reason = ex.reason if task_id is None else f'{ex.reason} (task {task_id})'
            self._tally.record(batch, self.job.failed(batch, reason, key, task_id))
        except Exception as ex:  # noqa: BLE001 - a client bug still accounts for the rows
            if self._owned_by_cancel(batch):
                return
            reason = f'client error: {type(ex).__name__}: {ex}'
            task_id = handle.id if handle is not None else None
            self._tally.record(batch, self.job.failed(batch, reason, key, task_id))
        finally:
            with self._lock:
                if batch.index not in self._cancel_owned:
                    self._open.pop(batch.index, None)
            if handle is not None:
                self._limit.done()
            self._limit.release()

    def _owned_by_cancel(self, batch):
        with self._lock:
            return batch.index in self._cancel_owned

    def _cancel_and_record(self, batch, handle, why):
        key = handle.idempotency_key
        try:
            task = self.client.cancel(handle)
        except errors.ClientError as ex:
            reason = f'{why}; cancel failed ({ex.reason}); task {handle.id} may still run'
            self._tally.record(batch, self.job.failed(batch, reason, key, handle.id))
            return
        if task.state == State.CANCELLED:
            self._tally.record(batch, self.job.failed(batch, f'cancelled: {why}', key, handle.id), task.state)
        elif task.finished:  # it ended before the cancel arrived: report what it did
            self._tally.record(batch, self.job.outcomes(batch, task, key), task.state)
        else:
            reason = f'{why}; task {handle.id} still {task.state} after cancel'
            self._tally.record(batch, self.job.failed(batch, reason, key, handle.id))

    # --- reporting -----------------------------------------------------------------------------------

    def snapshot(self):
        """The numbers the progress bar shows."""
        rows, waiting = self._tally.progress()
        elapsed = self.clock() - self._started_at if self._started_at is not None else 0.0
        return Snapshot(total=self.total_rows, matched=rows.get(RowStatus.MATCHED, 0),
                        no_match=rows.get(RowStatus.NO_MATCH, 0), failed=rows.get(RowStatus.FAILED, 0),
                        in_flight=self._limit.held, limit=self._limit.limit, waiting=waiting, elapsed=elapsed,
                        running=self._tally.running_rows())

    def _unrecorded_reason(self, batch):
        if batch.index in self._dispatched:
            return (f'{INTERRUPTED} while the call was being sent; the server may have taken it '
                    f'(Idempotency-Key {self.key_for(batch)})')
        if self._fatal is not None:
            return f'not submitted: an earlier call was {self._fatal.reason}'
        return f'not submitted: {INTERRUPTED}'

    def _report(self):
        return self._tally.report(
            self.job, self._batches,
            lambda batch: self.job.failed(batch, self._unrecorded_reason(batch), self.key_for(batch)),
            max_in_flight=self._limit.max_held, wall_seconds=round(self.clock() - self._started_at, 3),
            interrupted=self._interrupted)
