"""The records of heavy calls: a `Work` is one run of one computation, a `Call` is one user's handle on it.

A Work is what a worker runs: its inputs (endpoint, flags, payload), its queue and priority, its queue
deadline, its state, the worker that runs it and its heartbeat, the leases that worker renews, and how it
ended (error, timings; the result is django-celery-results' TaskResult row with the same id). Its id is the
Celery task id and the lease token. While it is open (queued or running) it is the one work of its work key
(workers.sharing): identical calls join it instead of running it again.

A Call is what one user sees: its owner, its Idempotency-Key and fingerprint, its usage (`rows`, charged
when it was admitted, given back when its work failed), its own admission (its headers and log line), how
it was served (`served_as`), when it was made and when its owner cancelled it, and the Work it points at.
The first call of a work has the work's id; a call that joins an open work, or is answered by a succeeded
one's result (a warm result), is a new Call on that Work. A call's visible state is a pure function of the
call and its work (workers.lifecycle.seen): nothing of the run is copied into calls.

Only workers.lifecycle writes these rows' states, each through one guarded UPDATE named in TRANSITIONS.
"""
from dataclasses import dataclass

from django.conf import settings
from django.db import models
from django.utils import timezone

from capacity.caller import MAX_RUN_CHARS


class ServedAs(models.TextChoices):
    RUN = 'run'              # the first call of its work: admitted, its work queued for it
    COALESCED = 'coalesced'  # it joined an identical call's open work: no lease, no message
    CACHED = 'cached'        # an identical call's succeeded work answered it: no admission, no queue


class State(models.TextChoices):
    """A work's state; a call shows its work's, or `cancelled` once its owner cancelled it."""

    QUEUED = 'queued'        # admitted; its message waits on its queue; no worker started it yet
    RUNNING = 'running'      # a worker runs it; `heartbeat_at` says the worker is alive
    SUCCEEDED = 'succeeded'  # its result is stored (TaskResult, by the work's id)
    FAILED = 'failed'        # an error or a time limit: `error`, and what the in-request endpoint answers
    CANCELLED = 'cancelled'  # its last open call was cancelled, or its message was revoked before it ran
    EXPIRED = 'expired'      # it didn't start before its queue deadline, and never will


FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED)
OPEN_STATES = (State.QUEUED, State.RUNNING)


@dataclass(frozen=True)
class Transition:
    """One state change of a work: the states it may start from and the state it ends in."""

    source: tuple
    target: State


# Every state change of a work, by the name of the workers.lifecycle function that makes it. Each is one
# guarded UPDATE (`state IN source` in its WHERE clause: workers.lifecycle.transitions.move), so of two
# racing transitions only one wins; tests/integration/workers/test_transitions.py holds every function
# against this table.
TRANSITIONS = {
    'start': Transition((State.QUEUED,), State.RUNNING),         # a worker claims it
    'take_over': Transition((State.RUNNING,), State.RUNNING),    # a delivery replaces a worker that is gone
    'succeed': Transition((State.RUNNING,), State.SUCCEEDED),    # its worker stored the result
    'fail': Transition((State.RUNNING,), State.FAILED),          # an error, its soft time limit
    'time_out': Transition((State.RUNNING,), State.FAILED),      # its process was killed at the hard limit
    'cancel': Transition(OPEN_STATES, State.CANCELLED),          # its last open call was cancelled
    'revoke': Transition((State.QUEUED,), State.CANCELLED),      # its message was revoked before it started
    'expire': Transition((State.QUEUED,), State.EXPIRED),        # its queue deadline passed
}


class Work(models.Model):
    # Not a field: the notice channel of the API process whose request waits for this work, as its message
    # named it (workers.notify.reply_to); its end is announced there when no other call joined it.
    notice_to = None
    id = models.CharField(primary_key=True, max_length=32, editable=False)  # Celery task id, lease token
    # The key of identical work (workers.sharing.work_key): an open work answers every call with its key.
    work_key = models.CharField(max_length=64, blank=True, default='', db_index=True)
    endpoint = models.CharField(max_length=16)
    semantic = models.BooleanField(default=False)
    reranker = models.BooleanField(default=False)
    rows = models.PositiveIntegerField(default=0)
    payload = models.JSONField()  # the validated request body: what the work computes
    queue = models.CharField(max_length=32)  # the Celery queue it runs on (workers.lanes.QUEUES)
    priority = models.PositiveSmallIntegerField(default=9)  # lower runs first (Redis transport steps)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    # The leases its worker renews and releases (capacity.admission.Admission.worker_lease_message, with
    # each lane's limit for a retake): the first call's, without its API host's lane.
    lease = models.JSONField(default=dict)
    # Open calls that point at it: 1 when it is made, one more for each call that joins it, one less for
    # each that is cancelled; the work is cancelled with its last one (lifecycle.ending.cancel).
    holders = models.PositiveIntegerField(default=1)
    shared = models.BooleanField(default=False)  # a second call ever joined it
    attempts = models.PositiveSmallIntegerField(default=0)  # deliveries that started it
    worker = models.CharField(max_length=255, blank=True, default='')  # '<node> pid <pid>' of its last run
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # its running worker was alive then
    error = models.TextField(blank=True, default='')
    # What the in-request endpoint would have answered for its failure: its status and JSON body.
    error_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_body = models.JSONField(null=True, blank=True)
    lease_lost = models.BooleanField(default=False)
    limiter_error = models.CharField(max_length=300, blank=True, default='')  # a lease error met while running
    # The candidates its answer holds, all rows together (OCL's `num_returned` header), stored with the result
    # so the API answers it without parsing the result; null for rows stored before it was.
    answer_count = models.PositiveIntegerField(null=True, blank=True)
    # Rows its current run has done (of `rows`), written by its worker in batches (workers.progress); a new
    # run (a take-over, a delivery again) starts it at 0.
    rows_done = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()  # the queue deadline: not started by then, it never runs
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = 'heavy_work'
        indexes = [
            models.Index(fields=['queue', 'state', 'priority', 'created_at'], name='heavy_work_queue'),
            # Retention (ended before a time) and the sweep and metrics (open work) read by state.
            models.Index(fields=['state', 'finished_at'], name='heavy_work_state_finished'),
        ]

    def __str__(self):
        return f'{self.endpoint} work {self.id} {self.state}'

    @property
    def open(self):
        return self.state in OPEN_STATES

    @property
    def finished(self):
        return self.state in FINAL_STATES


class Call(models.Model):
    id = models.CharField(primary_key=True, max_length=32, editable=False)  # the handle's id (/tasks/<id>/)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name='heavy_calls')
    work = models.ForeignKey(Work, on_delete=models.CASCADE, related_name='calls')
    endpoint = models.CharField(max_length=16)
    rows = models.PositiveIntegerField(default=0)  # its usage: charged when admitted, given back on failure
    fingerprint = models.CharField(max_length=64)  # sha256 of the user-visible inputs
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # The submitting request's id (X-Request-Id, or made by the API): the worker's log lines carry it.
    request_id = models.CharField(max_length=100, blank=True, default='')
    # The client's run (`automatch_run_id` in X-OCL-Event-Metadata, capacity.caller.RequestFacts), whole: GET
    # and DELETE /tasks/?run= list and cancel an owner's calls of one run by exactly the id the client sent.
    run_id = models.CharField(max_length=MAX_RUN_CHARS, blank=True, default='')
    # True on a call stored while the API kept only a run id's first 20 characters (migration 0014): its
    # `run_id` may be the start of a longer id, which finds it too (workers.runs.of_run).
    run_id_cut = models.BooleanField(default=False)
    served_as = models.CharField(max_length=16, choices=ServedAs.choices, default=ServedAs.RUN)
    # What admission decided for this call: its headers and its log line (capacity.admission).
    admission = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    cancelled_at = models.DateTimeField(null=True, blank=True)  # its owner cancelled it

    class Meta:
        db_table = 'heavy_calls'
        constraints = [
            models.UniqueConstraint(fields=['owner', 'idempotency_key'], name='heavy_call_idempotency',
                                    condition=models.Q(idempotency_key__isnull=False)),
        ]
        indexes = [
            # GET /tasks/: an owner's calls newest first, and those of one run (DELETE /tasks/?run= too).
            models.Index(fields=['owner', '-created_at'], name='heavy_call_owner_created'),
            models.Index(fields=['owner', 'run_id'], name='heavy_call_owner_run'),
            models.Index(fields=['-created_at'], name='heavy_call_created'),  # staff: everyone's, newest first
        ]

    def __str__(self):
        return f'{self.endpoint} call {self.id} of work {self.work_id}'
