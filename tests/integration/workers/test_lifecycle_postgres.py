"""On PostgreSQL, a first delivery claims its work and reads it back with its first call in one statement
(workers/lifecycle/sql/claim_first.sql); elsewhere the ORM takes two. Both paths, side by side on the same
database, claim the same way and read the same rows.

    HEAVY_LANES_TEST_ON_POSTGRES=1 .venv/bin/python -m pytest -m postgres tests/integration/workers
import json
"""
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.conftest import missing_service
from tests.integration.workers.test_lifecycle import another, queued, quiet  # noqa: F401 - quiet is autouse
from workers import lifecycle
from workers.lifecycle import statements
from workers.models import Call, State, Work

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def on_postgres():
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')


def fields(instance):
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


def test_a_first_claim_reads_back_the_claimed_work_and_its_first_call_as_the_orm_reads_them(make_user, lanes):
    user = make_user()
    first = queued(user)
    another(user, first.work)  # a second call changes nothing of the first's read

    claimed = lifecycle.claim_first(first.work_id, 'w@a pid 1')

    assert claimed is not None and claimed.pk == first.pk
    stored = Call.objects.select_related('work').get(pk=first.pk)
    assert fields(claimed) == fields(stored) and fields(claimed.work) == fields(stored.work)
    work = claimed.work
    assert (work.state, work.attempts, work.worker) == (State.RUNNING, 1, 'w@a pid 1')
    assert work.started_at == work.heartbeat_at and work.lease == first.work.lease and work.shared


@pytest.mark.parametrize('fields_of_work', [
    {'state': State.RUNNING, 'attempts': 1},                          # claimed already
    {'attempts': 1},                                                  # delivered before: load and start decide
    {'expires_at': timezone.now() - timedelta(seconds=1)},            # past its queue deadline
    {'state': State.CANCELLED},
])
def test_a_first_claim_claims_only_a_queued_never_delivered_work_before_its_deadline(fields_of_work, make_user,
                                                                                      lanes):
    first = queued(make_user(), **fields_of_work)
    assert lifecycle.claim_first(first.work_id, 'w@a pid 1') is None
    assert fields(Work.objects.get(pk=first.work_id)) == fields(first.work)  # nothing changed


@pytest.mark.parametrize('path', ['one statement', 'orm'])
def test_of_two_claims_one_wins(path, make_user, lanes, monkeypatch):
    first = queued(make_user())
    twin = Work.objects.get(pk=first.work_id)
    if path == 'orm':
        monkeypatch.setattr(statements, 'available', lambda: False)
        assert lifecycle.start(first.work, 'w@a pid 1').kind == lifecycle.RUN
    else:
        assert lifecycle.claim_first(first.work_id, 'w@a pid 1') is not None
    assert lifecycle.claim_first(first.work_id, 'w@b pid 2') is None
    assert lifecycle.start(twin, 'w@b pid 2').kind == lifecycle.BUSY  # read before the claim: it lost
    assert Work.objects.get(pk=first.work_id).worker == 'w@a pid 1'
