"""The load generator: mixed tiers for a set time, every call accounted for, lanes sampled."""
import io
import json
from collections import Counter

from heavy_lanes_client.cli import main
from heavy_lanes_client.load import LoadGenerator
from heavy_lanes_client.load_plan import Account, LoadPlan
from heavy_lanes_client.load_report import format_load_report
from tests.unit.client.fake_api import Error, Trickle

SOURCE = '/orgs/HPO/sources/HPO/'


def make_plan(api, **overrides):
    values = dict(url=api.url, accounts=(Account('core', 't-core'), Account('preview', 't-preview')), users=4,
                  seconds=1.0, source=SOURCE, staff_token='t-staff', sample_interval=0.05, drain_seconds=2.0,
                  max_backoff=0.1, think_seconds=0.02, long_poll=2, http_timeout=2.0, seed=7)
    values.update(overrides)
    return LoadPlan(**values)


def test_every_call_is_accounted_for_by_tier_and_the_lanes_are_sampled(api):
    api.per_token_limit = {'t-core': 2, 't-preview': 1}  # the fake enforces: beyond this, 429 capacity
    api.task_seconds = 0.1
    api.suggested = 1

    report = LoadGenerator(make_plan(api)).run()

    posts = api.posts()
    outcomes = Counter(call.outcome for call in report.calls)
    assert report.ok and report.unaccounted == 0
    assert len(report.calls) == len(posts)  # one send per call: no faults here
    assert outcomes['refused'] == sum(1 for post in posts if post.answer == 429) > 0
    assert outcomes['succeeded'] == sum(1 for task in api.tasks.values() if task.state == 'succeeded') > 0
    assert outcomes['succeeded'] + outcomes['refused'] == len(report.calls)
    assert all(task.state in ('succeeded', 'cancelled') for task in api.tasks.values())
    tiers = {group.name: group for group in report.by_tier}
    assert set(tiers) == {'core', 'preview', 'all'}
    assert tiers['core'].calls + tiers['preview'].calls == tiers['all'].calls == len(report.calls)
    assert tiers['core'].admitted == tiers['core'].count('succeeded') + tiers['core'].count('cancelled')
    assert tiers['all'].p50 is not None and tiers['all'].p50 <= tiers['all'].p99 <= tiers['all'].max
    assert {call.kind for call in report.calls} >= {'single', 'bulk'}
    lanes = {lane.lane: lane for lane in report.server_lanes}
    assert report.samples >= 10
    assert 1 <= lanes['api_heavy'].max_in_flight <= api.max_open and lanes['api_heavy'].limit == 4
    assert lanes['tier:core'].max_in_flight <= 2 and lanes['tier:preview'].max_in_flight <= 1
    client_lanes = {lane.lane: lane.max_in_flight for lane in report.client_lanes}
    assert set(client_lanes) <= set(api.max_open_lane) and all(value >= 1 for value in client_lanes.values())
    text = format_load_report(report)
    assert 'none lost' in text and 'Largest in flight per lane (server' in text


def test_a_call_sent_again_after_a_503_carries_the_same_key_and_the_same_body(api):
    api.script.extend([Error(status=503)] * 3)  # the first sends fail; each is sent again

    report = LoadGenerator(make_plan(api, users=1, seconds=0.3, staff_token=None)).run()

    assert report.ok and report.unaccounted == 0
    by_key = {}
    for post in api.posts():
        by_key.setdefault(post.headers['idempotency-key'], []).append(post)
    resent = [posts for posts in by_key.values() if len(posts) > 1]
    assert resent
    for posts in resent:
        assert all(post.body == posts[0].body and post.query == posts[0].query for post in posts)


def test_tasks_still_running_at_the_end_are_cancelled_and_counted(api):
    api.hold_tasks = True

    report = LoadGenerator(make_plan(api, users=2, seconds=0.3, drain_seconds=0.3, staff_token=None)).run()

    assert report.ok
    assert [call.outcome for call in report.calls] == ['cancelled'] * len(api.tasks) == ['cancelled'] * 2
    assert sorted(seen.path.split('/')[2] for seen in api.requests('DELETE')) == sorted(api.tasks)
    assert report.server_lanes == () and report.samples == 0


def test_a_call_never_answered_is_reported_unaccounted_and_the_exit_code_is_not_zero(api):
    api.default = Trickle(every=0.1)  # the answer never completes, and never times out either
    out, err = io.StringIO(), io.StringIO()

    code = main(['load', '--url', api.url, '--token', 'core:t-core', '--users', '1', '--seconds', '0.2',
                 '--drain-seconds', '0.2', '--timeout', '0.5', '--mix', 'single=1', '--source', SOURCE],
                out=out, err=err)

    assert code == 1
    assert 'Accounting: 1 calls = 0 succeeded' in out.getvalue() and '1 UNACCOUNTED' in out.getvalue()


def test_the_load_command_writes_a_json_report(api, tmp_path):
    tokens = tmp_path / 'tokens.json'
    tokens.write_text(json.dumps({'tokens': [{'token': 't-core', 'tier': 'core'}]}), encoding='utf-8')
    report_file = tmp_path / 'report.json'

    code = main(['load', '--url', api.url, '--tokens', str(tokens), '--users', '2', '--seconds', '0.3',
                 '--drain-seconds', '1', '--staff-token', 't-staff', '--mix', 'rerank=1,bulk-rerank=1',
                 '--json', str(report_file)], out=io.StringIO(), err=io.StringIO())

    assert code == 0
    written = json.loads(report_file.read_text())
    assert written['calls'] and {call['kind'] for call in written['calls']} <= {'rerank', 'bulk-rerank'}
    assert all(call['outcome'] == 'succeeded' for call in written['calls'])
