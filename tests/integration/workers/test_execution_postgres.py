"""Every case of test_execution.py again on PostgreSQL, where a first delivery whose message carries its
leases renews them and claims its work in one statement (workers.lifecycle.claim_first), and the cases only
that path has: what it reads and writes, and each way it falls back to reading the rows first.

    HEAVY_LANES_TEST_ON_POSTGRES=1 .venv/bin/python -m pytest -m postgres tests/integration/workers
"""
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.admission import LEASE_MESSAGE_KEYS
from tests.conftest import missing_service
from tests.integration.workers.test_execution import *  # noqa: F403 - every case, collected here again
from tests.integration.workers.test_execution import admitted, first_call, keys, now_ms, result, scores
from workers import execution, lifecycle
from workers.models import Call, State, Work

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def on_postgres():
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')


def message(work):
    return {key: work.lease[key] for key in LEASE_MESSAGE_KEYS}


def test_a_first_delivery_renews_then_claims_in_one_statement_without_reading_the_row(make_user, lanes, lines):
    call = admitted(make_user(), work_key='w' * 64)
    seen = {}

    def perform(row):
        seen['before'] = [query['sql'] for query in queries.captured_queries]
        seen['scores'] = scores(lanes, row)
        seen['row'] = Work.objects.get(pk=row.pk)
        return {'ok': True}
    with CaptureQueriesContext(connection) as queries:
        assert execution.run(call.pk, perform=perform, node='w@h', leases=message(call)) == {'ok': True}
    assert len(seen['before']) == 1 and seen['before'][0].lstrip().startswith('-- CLAIM_FIRST')  # no read
    assert max(seen['scores']) < now_ms(lanes) + 61_000  # renewed: lease_seconds
    assert (seen['row'].state, seen['row'].attempts) == (State.RUNNING, 1)
    assert seen['row'].worker.startswith('w@h pid ') and seen['row'].started_at == seen['row'].heartbeat_at
    call.refresh_from_db()
    assert call.state == State.SUCCEEDED and result(call) == {'ok': True}
    assert scores(lanes, call) == [None] * len(keys(call))  # released
    assert lines.call_args.args[0]['lease_lost'] is None


def test_the_leases_are_renewed_before_the_row_says_running(make_user, lanes, lines):
    call = admitted(make_user())
    order = []
    renew = execution.lease_from_message

    def tracked(*args, **kwargs):
        lease = renew(*args, **kwargs)
        real = lease.renew
        lease.renew = lambda: (order.append(('renew', Work.objects.get(pk=call.pk).state)), real())[1]
        return lease
    with mock.patch.object(execution, 'lease_from_message', tracked):
        execution.run(call.pk, perform=lambda row: {}, node='w@h', leases=message(call))
    assert order == [('renew', State.QUEUED)]


@pytest.mark.parametrize('case', ['past its deadline', 'cancelled', 'delivered before', 'not committed yet'])
def test_a_delivery_the_statement_cant_claim_reads_the_row_and_decides_as_before(case, make_user, lanes, lines):
    call = admitted(make_user())
    leases = message(call)
    perform = mock.Mock(return_value={'ok': True})
    if case == 'past its deadline':
        Work.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
        assert execution.run(call.pk, perform=perform, leases=leases) is None
        assert Work.objects.get(pk=call.pk).state == State.EXPIRED
        assert scores(lanes, call) == [None] * len(keys(call))
    elif case == 'cancelled':
        lifecycle.cancel(first_call(call.pk))
        assert execution.run(call.pk, perform=perform, leases=leases) is None
        assert scores(lanes, call) == [None] * len(keys(call))  # the renewal revived nothing
    elif case == 'delivered before':
        Work.objects.filter(pk=call.pk).update(state=State.RUNNING, attempts=1, worker='gone@h pid 1',
                                                    heartbeat_at=timezone.now() - timedelta(minutes=5))
        assert execution.run(call.pk, perform=perform, node='w@h', leases=leases) == {'ok': True}
        assert Work.objects.get(pk=call.pk).attempts == 2  # taken over, once
    else:
        first = Call.objects.get(pk=call.pk)
        Work.objects.filter(pk=call.pk).delete()
        real_claim = lifecycle.claim_first

        def claim_then_commit(work_id, worker):
            claimed = real_claim(work_id, worker)  # the API's commit is a moment behind its message
            call.save(force_insert=True)
            first.save(force_insert=True)
            return claimed
        with mock.patch.object(lifecycle, 'claim_first', claim_then_commit):
            assert execution.run(call.pk, perform=perform, node='w@h', leases=leases) == {'ok': True}
        assert Work.objects.get(pk=call.pk).state == State.SUCCEEDED
    assert perform.call_count == (1 if case in ('delivered before', 'not committed yet') else 0)


def test_a_message_whose_leases_header_is_not_ours_is_delivered_as_one_without(make_user, lanes, lines):
    call = admitted(make_user())
    with CaptureQueriesContext(connection) as queries:
        assert execution.run(call.pk, perform=lambda row: {}, node='w@h', leases={'keys': 'x'}) == {}
    assert not queries.captured_queries[0]['sql'].lstrip().startswith('-- CLAIM_FIRST')
    assert Work.objects.get(pk=call.pk).state == State.SUCCEEDED
