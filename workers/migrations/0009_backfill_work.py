"""Backfill: one Work for every call that ran its own work (a leader, or a call nobody joined), with the
call's id; every call then points at the work that answers it (its own, or its leader's), and a call its
owner let go of (a detached leader, a cancelled call) says when. Nothing is deleted: every queued and
running call keeps running under its work, whose id is the task id its message carries.

The reverse writes the run's facts back into every call, so a deploy can be rolled back to 0007's code.
"""
from collections import defaultdict

from django.db import migrations
from django.db.models import F
from django.db.models.functions import Coalesce, Now

OPEN = ('queued', 'running')
HOST_LANE = 'api_heavy_task'  # the API host's lane: the API lets go of it, never the worker
BATCH = 500
RUN_FIELDS = ('work_key', 'endpoint', 'semantic', 'reranker', 'rows', 'payload', 'queue', 'priority', 'state',
              'attempts', 'worker', 'heartbeat_at', 'error', 'error_status', 'error_body', 'lease_lost',
              'limiter_error', 'created_at', 'expires_at', 'started_at', 'finished_at')


def worker_lease(admission, token):
    """The worker's leases, as a call's admission (capacity.admission.Admission.to_json) names them."""
    admission = admission or {}
    lanes = [lane for lane in admission.get('lanes') or () if lane[0] != HOST_LANE]
    return {'keys': [lane[1] for lane in lanes], 'token': token, 'holding': bool(admission.get('holding')),
            'acquired_ms': int(admission.get('acquired_ms') or 0), 'limits': [int(lane[2]) for lane in lanes]}


def forward(apps, schema_editor):
    HeavyCall = apps.get_model('workers', 'HeavyCall')
    Work = apps.get_model('workers', 'Work')
    joined = defaultdict(list)  # leader id -> the states of the calls that joined its work
    for leader_id, state in HeavyCall.objects.filter(leader__isnull=False, served_as='coalesced').values_list(
            'leader_id', 'state').iterator():
        joined[leader_id].append(state)
    batch = []
    for call in HeavyCall.objects.filter(leader__isnull=True).order_by('pk').iterator(chunk_size=BATCH):
        states = joined.get(call.pk, ())
        batch.append(Work(
            id=call.pk, lease=worker_lease(call.admission, call.pk), shared=bool(states),
            holders=(call.detached_at is None) + sum(1 for state in states if state in OPEN),
            **{name: getattr(call, name) for name in RUN_FIELDS}))
        if len(batch) >= BATCH:
            Work.objects.bulk_create(batch)
            batch = []
    Work.objects.bulk_create(batch)
    HeavyCall.objects.filter(leader__isnull=True).update(work_id=F('id'))
    HeavyCall.objects.filter(leader__isnull=False).update(work_id=F('leader_id'))
    HeavyCall.objects.filter(detached_at__isnull=False).update(cancelled_at=F('detached_at'))
    HeavyCall.objects.filter(detached_at__isnull=True, state='cancelled').update(
        cancelled_at=Coalesce(F('finished_at'), Now()))


def backward(apps, schema_editor):
    HeavyCall = apps.get_model('workers', 'HeavyCall')
    Work = apps.get_model('workers', 'Work')
    for work in Work.objects.order_by('pk').iterator(chunk_size=BATCH):
        run = {name: getattr(work, name) for name in RUN_FIELDS if name not in ('created_at', 'rows', 'endpoint')}
        refunded = {'refunded_at': work.finished_at} if work.state == 'failed' else {}
        calls = HeavyCall.objects.filter(work_id=work.pk)
        calls.filter(pk=work.pk).update(leader=None, **run, **refunded)
        calls.exclude(pk=work.pk).update(leader_id=work.pk, **run, **refunded)
        if work.state in OPEN:  # a call its owner let go of while the work goes on: detached, or cancelled alone
            calls.filter(pk=work.pk, cancelled_at__isnull=False).update(detached_at=F('cancelled_at'))
            calls.exclude(pk=work.pk).filter(cancelled_at__isnull=False).update(
                state='cancelled', finished_at=F('cancelled_at'))
        calls.filter(served_as='cached').update(state='succeeded', started_at=F('created_at'),
                                                 finished_at=F('created_at'), expires_at=F('created_at'))


class Migration(migrations.Migration):

    dependencies = [
        ('workers', '0008_work'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
