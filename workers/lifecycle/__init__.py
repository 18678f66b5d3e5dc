"""The lifecycle of heavy calls: every state change of a work is one function here, one guarded UPDATE
(workers.models.TRANSITIONS, through `transitions.move`), and what a call's owner sees is a pure function
of the call and its work (`seen`).

    queued ──start──▶ running ──succeed──▶ succeeded
      │                  ├──fail / time_out──▶ failed
      ├──cancel──▶ cancelled ◀──cancel──┘       (with its last open call)
      ├──revoke──▶ cancelled                     (its message revoked before it ran)
      └──expire──▶ expired                       (not started before its queue deadline)
    running ──take_over──▶ running               (a delivery replaces a worker that is gone)

- create: `enqueue(work, call)` writes a work, its first call and publishes its message in one transaction
  (no row without a message); `send` publishes it (the sweep sends a lost one again); `join` adds a call
  to an open work, `serve_cached` one answered by a succeeded work's result.
- running (the worker's side): `start` claims a work (`claim_first`: a first delivery's claim and read in
  one statement where it can), `beat` is its heartbeat, `note_rows` how far its run has got, `succeed`
  stores the result through django-celery-results with the state, `fail` and `time_out` record a failure.
- ending: `cancel(call)` lets one call go, and cancels the work with its last open call (`cancel_all`: many
  at once, a client's run); `end_unstarted`
  and `expire` end a work that won't run, `stopped` a cancelled one whose run has stopped; `ended` and
  `end_with_release` follow every end (counts, log lines, completion notice, the work's release).
- upkeep, for the sweep and retention: `overdue`, `maybe_lost`, `redeliver`, `stranded`, `forget_finished`.
- reads: `seen`, `result` (`result_json`: the stored text, unparsed), `answer`, `position`, `progress`,
  `wait` (with `watching`), `log_line`.

Workers and views call this package and never write a state themselves; it is the only code that reads
stored results.
"""
from workers.lifecycle.create import enqueue, join, queued_lease_ms, send, serve_cached
from workers.lifecycle.ending import (
    cancel, cancel_all, discard_message, end_unstarted, end_with_release, ended, expire, note_limiter, stopped,
    taken_over, wait_stopped, worker_lease,
)
from workers.lifecycle.reads import (
    Progress, StoredJSON, Waited, admission_of, answer, log_line, position, progress, result, result_json,
    stored_result, wait, watching,
)
from workers.lifecycle.running import (
    BUSY, ENDED, EXPIRE, HARD_LIMIT, RUN, SOFT_LIMIT, Failure, Start, beat, busy_retry_in, claim_first,
    claim_first_available, fail, holder_gone, load, note_rows, start, succeed, time_out, worker_name,
)
from workers.lifecycle.seen import CANCELLED, EXPIRED, FAILED, Seen, seen
from workers.lifecycle.upkeep import forget_finished, maybe_lost, overdue, queued, redeliver, stranded

__all__ = [
    'BUSY', 'CANCELLED', 'ENDED', 'EXPIRE', 'EXPIRED', 'FAILED', 'Failure', 'HARD_LIMIT', 'Progress', 'RUN',
    'SOFT_LIMIT', 'Seen', 'Start', 'StoredJSON', 'Waited', 'admission_of', 'answer', 'beat', 'busy_retry_in',
    'cancel', 'cancel_all', 'claim_first', 'claim_first_available', 'discard_message', 'end_unstarted',
    'end_with_release',
    'ended', 'enqueue', 'expire', 'fail', 'forget_finished', 'holder_gone', 'join', 'load', 'log_line',
    'maybe_lost', 'note_limiter', 'note_rows', 'overdue', 'position', 'progress', 'queued', 'queued_lease_ms',
    'redeliver', 'result', 'result_json', 'seen', 'send', 'serve_cached', 'start', 'stopped', 'stored_result',
    'stranded', 'succeed', 'taken_over', 'time_out', 'wait', 'wait_stopped', 'watching', 'worker_lease',
    'worker_name',
]
