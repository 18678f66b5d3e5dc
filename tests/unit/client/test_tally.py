"""Tally: each kind of answer is counted apart."""
from heavy_lanes_client import RowStatus
from tests.unit.client.fake_api import RateLimit
from tests.unit.client.helpers import ROWS, keys_of, make_run


def test_a_rate_limit_is_counted_apart_from_a_capacity_refusal(api, client, sleeps):
    api.script.append(RateLimit(retry_after=1))

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    s = report.summary
    assert (s.refused_capacity, s.rate_limited, s.server_errors) == (0, 1, 0)
    assert report.outcomes[0].status == RowStatus.MATCHED
    assert len(set(keys_of(api.posts()))) == 1
