"""The record of every heavy call the API accepted: who, what, which queue, and where it is now.

The row is also the call's usage record (metering): `rows` units, charged when the call is admitted, and
given back (`refunded_at`) when it fails. A row exists only for a call that reached its queue: the
submission service creates it in the same transaction that publishes the message, so a failed publish
leaves no row. The id is the Celery task id and the lease token (uuid4 hex: 122 random bits, so ids can't
be guessed). The result itself is stored by the Celery result backend (django-celery-results' TaskResult,
same id); this row holds the lifecycle, and only workers.lifecycle changes its state.
"""
from django.conf import settings
from django.db import models
from django.utils import timezone


class ServedAs(models.TextChoices):
    RUN = 'run'              # its own work ran (or will run) on a worker
    COALESCED = 'coalesced'  # it joined an identical call's work (its leader): no lease, no message
    CACHED = 'cached'        # an identical call's stored result answered it: no admission, no queue


class State(models.TextChoices):
    QUEUED = 'queued'
    RUNNING = 'running'
    SUCCEEDED = 'succeeded'
    FAILED = 'failed'
    CANCELLED = 'cancelled'
    EXPIRED = 'expired'


FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.EXPIRED)
OPEN_STATES = (State.QUEUED, State.RUNNING)


class HeavyCall(models.Model):
    id = models.CharField(primary_key=True, max_length=32, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name='heavy_calls')
    endpoint = models.CharField(max_length=16)
    queue = models.CharField(max_length=32)  # the Celery queue it runs on (workers.lanes.QUEUES)
    semantic = models.BooleanField(default=False)
    reranker = models.BooleanField(default=False)
    rows = models.PositiveIntegerField(default=0)
    priority = models.PositiveSmallIntegerField(default=9)  # lower runs first (Redis transport steps)
    payload = models.JSONField()  # the validated request body
    fingerprint = models.CharField(max_length=64)  # sha256 of the user-visible inputs
    # The work's key (workers.sharing.work_key): the endpoint, its inputs and the source version they read.
    # Identical calls share one run: the first leads; the others point at it (`leader`) and get its result.
    work_key = models.CharField(max_length=64, blank=True, default='', db_index=True)
    leader = models.ForeignKey('self', null=True, blank=True, on_delete=models.CASCADE, related_name='followers')
    served_as = models.CharField(max_length=16, choices=ServedAs.choices, default=ServedAs.RUN)
    # Its owner cancelled a call whose work other handles still share: the owner sees it cancelled, and the
    # work goes on for the others (it is cancelled with its last handle).
    detached_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # The submitting request's id (X-Request-Id, or made by the API): the worker's log lines for the call
    # carry it (common.request_id).
    request_id = models.CharField(max_length=100, blank=True, default='')
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    # What admission decided and which lanes the worker must renew and release (capacity.admission).
    admission = models.JSONField(default=dict)
    error = models.TextField(blank=True, default='')
    # What the in-request endpoint would have answered for this failure: its status and JSON body (a bad row
    # found by the worker is a 400 naming it). A waiting request answers with these.
    error_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_body = models.JSONField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)  # deliveries that started the work
    worker = models.CharField(max_length=255, blank=True, default='')  # '<node> pid <pid>' of the last run
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # the running worker was alive then
    lease_lost = models.BooleanField(default=False)
    limiter_error = models.CharField(max_length=300, blank=True, default='')  # a lease error met while running
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()  # the queue deadline: not started by then, it never runs
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    refunded_at = models.DateTimeField(null=True, blank=True)  # usage given back: the call failed

    class Meta:
        db_table = 'heavy_calls'
        constraints = [
            models.UniqueConstraint(fields=['owner', 'idempotency_key'], name='heavy_call_idempotency',
                                    condition=models.Q(idempotency_key__isnull=False)),
        ]
        indexes = [
            models.Index(fields=['queue', 'state', 'priority', 'created_at'], name='heavy_call_queue'),
            # Retention (finished before a time) and the sweep and metrics (open calls) read by state.
            models.Index(fields=['state', 'finished_at'], name='heavy_call_state_finished'),
        ]

    def __str__(self):
        return f'{self.endpoint} {self.id} {self.state}'

    @property
    def finished(self):
        """Whether the call is over for its owner: it ended, or its owner cancelled it while others share
        its work (it is detached: the work goes on for them)."""
        return self.state in FINAL_STATES or self.detached_at is not None

    @property
    def seen_state(self):
        """The state its owner sees: `cancelled` once detached, else its state."""
        return State.CANCELLED if self.detached_at is not None else self.state

    @property
    def work_id(self):
        """The id of the call whose work answers this one: its leader's, or its own."""
        return self.leader_id or self.pk
