"""Jobs: batches cover the rows, and each row ends matched, no match or failed by what its task did."""
from heavy_lanes_client import RowStatus, Run
from heavy_lanes_client.rows import candidate_fields as describe
from tests.unit.client.helpers import ROWS, make_run


def test_batches_cover_every_row_once_in_input_order(api, client, sleeps):
    report = make_run(client, sleeps).execute()

    sent = {tuple(row['name'] for row in post.body['rows']) for post in api.posts()}
    assert sent == {('chest pain', 'short of breath'), ('pounding headache', 'dizzy when standing up'),
                    ('itchy rash',)}
    assert [outcome.name for outcome in report.outcomes] == ROWS
    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED] * 5
    assert report.outcomes[0].top['display_name'] == 'Chest Pain'
    assert report.ok and report.summary.admitted == 3 and report.summary.submissions == 3


def test_a_failed_task_makes_its_rows_failed_never_no_match(api, client, sleeps):
    api.final_states.extend(['failed'])

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.FAILED, RowStatus.FAILED]
    assert report.outcomes[0].reason == 'task failed: The worker failed: scripted failure.'
    assert report.outcomes[0].task_id in api.tasks
    assert report.summary.no_match == 0 and report.summary.tasks_failed == 1 and not report.ok


def test_an_expired_task_makes_its_rows_failed(api, client, sleeps):
    api.final_states.extend(['expired'])

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    assert report.outcomes[0].status == RowStatus.FAILED
    assert report.outcomes[0].reason.startswith('task expired')
    assert report.summary.tasks_expired == 1


def test_no_match_only_for_a_row_the_server_ran_and_found_nothing_for(api, client, sleeps):
    api.no_match = {'short of breath'}

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.NO_MATCH]
    assert report.outcomes[1].reason is None and report.ok


def test_a_row_missing_from_a_succeeded_result_is_failed_not_no_match(api, client, sleeps):
    api.short_results = True

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.FAILED]
    assert report.outcomes[1].reason == 'the task result has no entry for this row'


def test_a_rerank_run_gives_each_query_its_best_row(api, client, sleeps):
    report = Run.rerank(client, ['chest pain', 'fever'], ['angina', 'pyrexia'], sleep=sleeps).execute()

    assert [outcome.name for outcome in report.outcomes] == ['chest pain', 'fever']
    assert [outcome.top['name'] for outcome in report.outcomes] == ['angina', 'angina']
    assert sorted(post.body['q'] for post in api.posts()) == ['chest pain', 'fever']


def test_rows_are_read_from_ocls_wire_format_a_list_with_one_entry_per_row(api, client, sleeps):
    api.wire_format = True
    api.no_match = {'short of breath'}

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.NO_MATCH]
    top = report.outcomes[0].top
    assert top['display_name'] == ROWS[0].title() and top['search_meta']['search_score'] == 0.9
    assert describe(top) == (top['id'], ROWS[0].title(), 0.9)


def test_a_row_missing_from_a_wire_format_result_is_failed_not_no_match(api, client, sleeps):
    api.wire_format = True
    api.short_results = True

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.FAILED]


def test_rows_are_read_from_the_shape_of_servers_before_ocls_format(api, client, sleeps):
    api.wire_format = False
    api.no_match = {'short of breath'}

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.NO_MATCH]
    assert describe(report.outcomes[0].top) == (report.outcomes[0].top['code'], ROWS[0].title(), 0.9)
