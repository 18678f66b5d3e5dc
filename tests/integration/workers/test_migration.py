"""A deploy across the Work/Call migrations (workers 0008-0010) loses no call: calls queued, running, joined,
let go of and answered from a warm result under the old schema (one HeavyCall row each) are one work per
run afterwards, every call shows what it showed before, and the queued and running ones run on to their end
under the new code. On SQLite, and again on PostgreSQL (where the backfill's updates and the ALTERs that
follow them must be in separate transactions)."""
import json
from datetime import timedelta
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from capacity import gate
from capacity.constants import Lane
from tests.conftest import missing_service
from workers import execution, lifecycle
from workers.models import Call, Work

BEFORE = ('workers', '0007_shared_work')


def old_models():
    state = MigrationExecutor(connection).loader.project_state(BEFORE)
    return state.apps.get_model('workers', 'HeavyCall')


def old_call(HeavyCall, user, **fields):
    admission = gate.admit(user, endpoint='$match', rows=2, semantic=True, queue='es2_knn', draws_on=Lane.ES2_KNN)
    now = timezone.now()
    values = dict(id=admission.token, owner_id=user.pk, endpoint='$match', queue='es2_knn', semantic=True,
                  rows=2, payload={'rows': []}, fingerprint='f', work_key='k' * 64, admission=admission.to_json(),
                  created_at=now, expires_at=now + timedelta(minutes=10))
    return HeavyCall.objects.create(**{**values, **fields})


def deploy_across_the_migration(make_user, lanes):
    user = make_user()
    call_command('migrate', 'workers', BEFORE[1], verbosity=0)
    try:
        HeavyCall = old_models()
        now = timezone.now()
        queued = old_call(HeavyCall, user)
        joined = old_call(HeavyCall, user, leader_id=queued.pk, served_as='coalesced', admission={})
        running = old_call(HeavyCall, user, work_key='r' * 64, state='running', attempts=1,
                           worker='gone@node pid 1', started_at=now - timedelta(minutes=3),
                           heartbeat_at=now - timedelta(minutes=3))  # its node died in the deploy
        detached = old_call(HeavyCall, user, work_key='d' * 64, detached_at=now)
        left_alone = old_call(HeavyCall, user, work_key='d' * 64, leader_id=detached.pk, served_as='coalesced',
                              admission={})
        done = old_call(HeavyCall, user, work_key='s' * 64, state='succeeded', started_at=now,
                        finished_at=now)
        cached = old_call(HeavyCall, user, work_key='s' * 64, leader_id=done.pk, served_as='cached',
                          state='succeeded', started_at=now, finished_at=now, admission={})
        failed = old_call(HeavyCall, user, work_key='', state='failed', error='ValueError: x', error_status=500,
                          started_at=now, finished_at=now, refunded_at=now)
        from workers.celery import app
        app.backend.store_result(done.pk, {'n': 'done'}, 'SUCCESS')
    finally:
        call_command('migrate', verbosity=0)  # the deploy: every migration, as `make run` and the image run them

    def shows(call_id):
        call = Call.objects.select_related('work').get(pk=call_id)
        return lifecycle.seen(call, call.work).state

    # One work per run, with the run's id; every call shows what it showed before.
    assert set(Work.objects.values_list('pk', flat=True)) == {queued.pk, running.pk, detached.pk, done.pk, failed.pk}
    assert Call.objects.count() == 8
    assert {call_id: shows(call_id) for call_id in (queued.pk, joined.pk, running.pk, detached.pk, left_alone.pk,
                                                    done.pk, cached.pk, failed.pk)} == {
        queued.pk: 'queued', joined.pk: 'queued', running.pk: 'running', detached.pk: 'cancelled',
        left_alone.pk: 'queued', done.pk: 'succeeded', cached.pk: 'succeeded', failed.pk: 'failed'}
    assert Call.objects.get(pk=joined.pk).work_id == queued.pk
    assert Work.objects.get(pk=queued.pk).holders == 2 and Work.objects.get(pk=detached.pk).holders == 1
    assert Work.objects.get(pk=queued.pk).lease['keys'] == [key for lane, key, _, _ in queued.admission['lanes']]
    assert lifecycle.result(Call.objects.get(pk=cached.pk)) == {'n': 'done'}

    # The queued work runs on under the new code (its message carries its id); the one whose node died in
    # the deploy is taken over by its redelivery; each ends for every call on it.
    with mock.patch('workers.lifecycle.reads.emit'):
        for work_id in (queued.pk, running.pk, detached.pk):
            assert execution.run(work_id, perform=lambda work: {'ran': work.pk}, node='new@node') == {'ran': work_id}
    assert (shows(queued.pk), shows(joined.pk), shows(running.pk)) == ('succeeded',) * 3
    assert lifecycle.result(Call.objects.get(pk=joined.pk)) == {'ran': queued.pk}
    assert Work.objects.get(pk=running.pk).attempts == 2
    assert (shows(detached.pk), shows(left_alone.pk)) == ('cancelled', 'succeeded')
    assert json.loads(lifecycle.stored_result(detached.pk)) == {'ran': detached.pk}


@pytest.mark.django_db(transaction=True)
def test_a_deploy_across_the_migration_loses_no_call(make_user, lanes):
    deploy_across_the_migration(make_user, lanes)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_deploy_across_the_migration_loses_no_call_on_postgres(make_user, lanes):
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    deploy_across_the_migration(make_user, lanes)

