"""A running work's rows done (workers.lifecycle.note_rows): written only by the worker that runs it, and
started again at 0 by a run that takes it over."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.integration.workers.test_lifecycle import queued, quiet  # noqa: F401  (its fixture)
from workers import lifecycle
from workers.models import Work

pytestmark = pytest.mark.django_db


def test_a_run_that_takes_over_starts_its_rows_at_zero_and_the_gone_run_writes_no_more(make_user, lanes):
    gone = queued(make_user(), state='running', attempts=1, worker='w@gone pid 1', rows=1000, rows_done=600,
                  heartbeat_at=timezone.now() - timedelta(minutes=5)).work
    work = Work.objects.get(pk=gone.pk)
    assert lifecycle.start(work, 'w@me pid 2').kind == lifecycle.RUN
    assert work.rows_done == 0 and Work.objects.get(pk=work.pk).rows_done == 0
    assert not lifecycle.note_rows(gone, 700)  # the gone worker's late write changes nothing
    assert lifecycle.note_rows(work, 100)
    assert Work.objects.get(pk=work.pk).rows_done == 100


def test_a_queued_work_delivered_again_starts_at_zero(make_user, lanes):
    work = queued(make_user(), rows=1000, rows_done=300).work  # as a run before a redelivery left it
    assert lifecycle.start(work, 'w@me pid 2').kind == lifecycle.RUN
    assert Work.objects.get(pk=work.pk).rows_done == 0
    lifecycle.cancel(work.calls.get())
    assert not lifecycle.note_rows(work, 400)  # a cancelled work's run writes no more progress
