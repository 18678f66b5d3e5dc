"""Every transition of the table against every state, on the database: a guarded UPDATE moves a work only from
a state the table says it starts from, to the state it says it ends in; from any other it changes nothing.
The first delivery's claim on PostgreSQL is one statement of its own (sql/claim_first.sql): held against the
table's `start` too, in the PostgreSQL pass."""
import itertools
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.conftest import missing_service
from workers.lifecycle import statements
from workers.lifecycle.transitions import move
from workers.models import TRANSITIONS, Call, State, Work

pytestmark = pytest.mark.django_db


def work_in(state, user):
    work = Work.objects.create(id=uuid.uuid4().hex, endpoint='$match', queue='es2_knn', payload={}, state=state,
                               expires_at=timezone.now() + timedelta(minutes=10))
    Call.objects.create(id=work.pk, work=work, owner=user, endpoint='$match', fingerprint='f')
    return work


@pytest.mark.parametrize('name, state', list(itertools.product(TRANSITIONS, State.values)))
def test_a_transition_moves_a_work_only_from_the_states_the_table_names(name, state, make_user):
    work = work_in(state, make_user())
    moved = move(name, work.pk)
    transition = TRANSITIONS[name]
    assert moved == (1 if state in transition.source else 0)
    assert Work.objects.get(pk=work.pk).state == (transition.target if moved else state)


@pytest.mark.postgres
@pytest.mark.parametrize('state', State.values)
def test_the_first_claims_statement_is_the_tables_start(state, make_user):
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    work = work_in(state, make_user())
    claimed = statements.claim_first(work.pk, 'w@h pid 1')
    start = TRANSITIONS['start']
    assert (claimed is not None) == (state in start.source)
    assert Work.objects.get(pk=work.pk).state == (start.target if claimed else state)
