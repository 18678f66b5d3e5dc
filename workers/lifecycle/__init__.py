"""One heavy call's lifecycle: every state change is one function of this package, each a guarded UPDATE.

    queued ──start──▶ running ──succeed──▶ succeeded
      │                  ├──────fail─────▶ failed
      ├──cancel──▶ cancelled ◀──cancel──┘
      └──expire──▶ expired                 (not started before its queue deadline)

- create: `enqueue(call)` writes the row and publishes its message in one transaction (no row without a
  message); `send` publishes it (the sweep sends a lost one again).
- running (the worker's side): `start(call, worker)` claims a queued call for a worker (`claim_first`
  claims a first delivery's call without reading it first, where one statement can), or takes over a
  running one whose worker is gone (a redelivery); a message of a call that runs on a live worker gets
  `BUSY` and must not run now: it is looked at again once that worker's heartbeat would be stale (a
  duplicate if the call ends first, a redelivery from a dead worker if it doesn't). A call runs at most once
  at a time. `beat` is the running worker's heartbeat; False means the call is no longer its own (cancelled,
  or taken over) and the work must stop. `succeed` stores the result (django-celery-results' TaskResult, by
  task id) and the state in one transaction, so a poll that sees `succeeded` finds the result and a
  cancelled call never gets one; `fail` records the failure (with the status and body the in-request
  endpoint would have answered) and gives the usage back (the row is the usage record); `time_out` ends a
  call whose process was killed at its hard time limit.
- ending: `cancel` ends a queued call at once (its leases go back now) or a running one (its worker stops
  it and releases its leases once it has stopped: `stopped`); `expire` and `end_unstarted` end a call that
  will never run; `ended` follows every end (the counter, the log line, the completion notice).
- sharing: identical calls share one run of the work. `join` makes a follower of an open leader (no
  lease, no message: it follows the leader's state), `serve_cached` answers from a succeeded call's result;
  a leader's end `settle`s its followers; a cancelled leader with open followers is detached (its owner
  sees it cancelled; the work is cancelled with its last handle). `unsettled` finds followers left open.
- upkeep, for the sweep (workers.sweep) and retention (workers.retention): `overdue` and `maybe_lost`
  find the calls nothing else would end or run, `redeliver` publishes again the message of one that lost
  it, `stranded` finds cancelled calls whose worker may be gone, `forget_finished` deletes old calls with
  their results.
- reads: `position`, `estimate` and `progress` (when it should start and finish, the poll hint),
  `result`, `answer`, `wait` (with `watching`), `log_line`. Workers and views call this package and never
  write a call's state themselves; it is the only code that reads the stored results.
"""
from workers.lifecycle.create import enqueue, send
from workers.lifecycle.ending import (
    cancel, discard_message, end_unstarted, end_with_release, ended, expire, note_limiter, stopped, taken_over,
    wait_stopped,
)
from workers.lifecycle.reads import (
    Progress, admission_of, answer, error_of, estimate, log_line, position, progress, result, stored_result,
    wait, watching,
)
from workers.lifecycle.running import (
    BUSY, ENDED, EXPIRE, RUN, Failure, Start, beat, busy_retry_in, claim_first, claim_first_available, fail,
    holder_gone, load, start, succeed, time_out, worker_name,
)
from workers.lifecycle.sharing import join, serve_cached, settle, unsettled
from workers.lifecycle.upkeep import forget_finished, maybe_lost, overdue, redeliver, stranded
from workers.lifecycle.words import CANCELLED, EXPIRED, FAILED, HARD_LIMIT, SOFT_LIMIT

__all__ = [
    'BUSY', 'CANCELLED', 'ENDED', 'EXPIRE', 'EXPIRED', 'FAILED', 'Failure', 'HARD_LIMIT', 'Progress', 'RUN',
    'SOFT_LIMIT', 'Start', 'admission_of', 'answer', 'beat', 'busy_retry_in', 'cancel', 'claim_first',
    'claim_first_available', 'discard_message',
    'end_unstarted', 'end_with_release', 'ended', 'enqueue', 'error_of', 'estimate', 'expire', 'fail', 'forget_finished',
    'holder_gone', 'join', 'load', 'log_line', 'maybe_lost', 'note_limiter', 'overdue', 'position',
    'progress', 'redeliver', 'result', 'send', 'serve_cached', 'settle', 'start', 'stopped', 'stored_result',
    'stranded',
    'succeed', 'taken_over', 'time_out', 'unsettled', 'wait', 'wait_stopped', 'watching', 'worker_name',
]
