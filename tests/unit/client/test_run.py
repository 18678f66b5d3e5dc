"""Run: a rejection that concerns every batch stops the run; cancel and a task's timeout cancel its tasks."""
import threading

from heavy_lanes_client import PollPolicy, RowStatus
from tests.unit.client.fake_api import Invalid
from tests.unit.client.helpers import ROWS, make_run


def test_a_bad_source_stops_the_run_after_the_first_call(api, client, sleeps):
    api.script.append(Invalid({'target_repo_url': ["Unknown source '/orgs/X/sources/X/'."]}))

    report = make_run(client, sleeps).execute()

    assert len(api.posts()) == 1
    assert [outcome.status for outcome in report.outcomes] == [RowStatus.FAILED] * 5
    assert 'target_repo_url' in report.outcomes[0].reason
    assert report.outcomes[4].reason.startswith('not submitted: an earlier call was rejected')
    assert report.summary.rejected == 1


def test_cancel_deletes_every_task_in_flight_and_sends_nothing_more(api, client, sleeps):
    api.suggested = 3
    api.hold_tasks = True
    run = make_run(client, sleeps, rows=[f'row {i}' for i in range(5)], batch_size=1)
    result = {}
    thread = threading.Thread(target=lambda: result.update(report=run.execute()))
    thread.start()
    assert api.wait_for(lambda fake: len(fake.tasks) == 3)

    run.cancel()
    thread.join(5)

    report = result['report']
    deleted = sorted(seen.path.split('/')[2] for seen in api.requests('DELETE'))
    assert deleted == sorted(api.tasks)
    assert len(api.posts()) == 3
    statuses = [(outcome.status, outcome.reason) for outcome in report.outcomes]
    assert statuses[:3] == [(RowStatus.FAILED, 'cancelled: run interrupted')] * 3
    assert statuses[3:] == [(RowStatus.FAILED, 'not submitted: run interrupted')] * 2
    assert report.summary.interrupted and report.summary.tasks_cancelled == 3


def test_a_task_that_outlives_its_timeout_is_cancelled_and_its_rows_fail(api, client, sleeps):
    api.hold_tasks = True

    report = make_run(client, sleeps, rows=ROWS[:1],
                      poll=PollPolicy(long_poll_seconds=1, task_timeout_seconds=0.3)).execute()

    assert len(api.requests('DELETE')) == 1
    assert report.outcomes[0].status == RowStatus.FAILED
    assert report.outcomes[0].reason.startswith('cancelled: timed out after 0.3 s')
