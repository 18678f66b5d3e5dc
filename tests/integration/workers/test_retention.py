"""Retention: work that ended before the retention period is deleted with its calls and results;
everything newer, and all open work, stays; the finished-calls counter in /metrics doesn't drop when rows
go."""
import uuid
from datetime import timedelta

import pytest
from celery import states
from django.utils import timezone
from django_celery_results.models import TaskResult

from capacity.store import LaneStore, use_store
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_operations import scrape
from workers import lifecycle, retention
from workers.celery import app
from workers.models import Call, State, Work

pytestmark = pytest.mark.django_db
DAY = 24 * 3600


def call(user, state, ended_days_ago=None, created_days_ago=0, result=None):
    """A call of `user` with its work in `state`."""
    now = timezone.now()
    created_at = now - timedelta(days=created_days_ago)
    work = Work.objects.create(
        id=uuid.uuid4().hex, endpoint='$match', queue='es2_knn', payload={'rows': []}, state=state,
        created_at=created_at, expires_at=now + timedelta(minutes=10),
        finished_at=None if ended_days_ago is None else now - timedelta(days=ended_days_ago))
    if result is not None:
        app.backend.store_result(work.pk, result, states.SUCCESS)
    return Call.objects.create(id=work.pk, work=work, owner=user, endpoint='$match', fingerprint='f',
                               created_at=created_at)


def test_a_retention_run_deletes_only_work_that_ended_before_the_period_with_its_calls_and_results(
        make_user, settings):
    settings.HEAVY_LANES_RETENTION_SECONDS = 7 * DAY
    user = make_user()
    old = [call(user, State.SUCCEEDED, 8, 8, result={'n': 1}), call(user, State.FAILED, 7.01, 8),
           call(user, State.CANCELLED, 30, 30), call(user, State.EXPIRED, 9, 9)]
    kept = [call(user, State.SUCCEEDED, 6.9, 8, result={'n': 2}),
            call(user, State.SUCCEEDED, 0, 0, result={'n': 3}),
            call(user, State.QUEUED, created_days_ago=20), call(user, State.RUNNING, created_days_ago=20)]

    assert retention.prune(batch=2) == 4  # in batches of 2, each one transaction

    assert set(Call.objects.values_list('pk', flat=True)) == {row.pk for row in kept}
    assert set(Work.objects.values_list('pk', flat=True)) == {row.work_id for row in kept}
    assert not TaskResult.objects.filter(task_id__in=[row.pk for row in old]).exists()
    # A succeeded call inside the window still has its result.
    assert [lifecycle.result(row) for row in kept[:2]] == [{'n': 2}, {'n': 3}]
    assert retention.prune() == 0


def test_finished_calls_stay_counted_in_metrics_after_their_rows_are_deleted(
        make_user, settings, client, real_redis):
    use_store(LaneStore(real_redis))
    try:
        user = make_user()
        row = call(user, State.RUNNING, created_days_ago=10)
        assert lifecycle.succeed(row.work, {'ok': True})
        lifecycle.ended(row.work)  # what the worker does once it released the leases
        key = 'heavy_lanes_calls_finished_total{queue="es2_knn",state="succeeded"}'
        wait_until(lambda: scrape(client).get(key) == 1, timeout=5, message='the counter to reach Redis')
        Work.objects.filter(pk=row.work_id).update(finished_at=timezone.now() - timedelta(days=30))
        assert retention.prune() == 1 and not Call.objects.exists() and not Work.objects.exists()
        assert scrape(client)[key] == 1
    finally:
        use_store(None)
