"""The client's own reading of the RateLimit fields (the standard library alone) agrees with the reference
Structured Fields parser, and ignores a malformed field as the draft requires."""
import http_sf
import pytest

from heavy_lanes_client.models import Capacity
from heavy_lanes_client.ratelimit import Concurrency, concurrency, parse_list, wait_seconds

FIELDS = [
    '"es2_knn";q=2;qu="concurrent-requests", "rate";q=600;w=60',
    '"user";r=0;t=3, "tier";r=1;pk=:cHJldmlldw==:',
    'default;r=50;t=30',                     # a Token name
    '"a\\"b";q=1;flag;d=0.5;b=?0',            # escapes, a bare (true) parameter, a decimal, a boolean
    '"x";q=1 ,  "y";q=2',                    # whitespace around the comma
]


@pytest.mark.parametrize('text', FIELDS)
def test_it_reads_what_the_reference_parser_reads(text):
    reference = [(str(name), dict(params.items()))
                 for name, params in http_sf.parse(text.encode(), tltype='list')]
    assert parse_list(text) == reference


@pytest.mark.parametrize('text', [
    '"user";r=0,', '"user";r=', '"unterminated', '"x";q=1 "y";q=2', '("inner" "list")', ':bad*base64:',
    '"x";Q=1', '',
])
def test_a_malformed_field_is_ignored(text):
    assert parse_list(text) is None


def test_the_room_is_the_fewest_left_among_concurrency_quotas_and_only_those():
    headers = {'RateLimit-Policy': '"user";q=3;qu="concurrent-requests", '
                                   '"es2_knn";q=2;qu="concurrent-requests", "rate";q=600;w=60',
               'RateLimit': '"user";r=2, "es2_knn";r=0;t=4, "rate";r=0;t=50'}
    # The request rate is not a concurrency quota.
    assert concurrency(headers) == Concurrency(left=0, quota=2, reset=4)
    assert wait_seconds(headers) == 50  # but every exhausted quota counts when waiting
    assert concurrency({'RateLimit': '"user";r=2'}) == Concurrency()  # no policy says what it is


def test_capacity_reads_the_ratelimit_fields_only_without_the_capacity_headers():
    standard = {'RateLimit-Policy': '"user";q=3;qu="concurrent-requests"', 'RateLimit': '"user";r=1'}
    assert Capacity.from_headers(standard).room == 1 and Capacity.from_headers(standard).counted
    ours = {**standard, 'X-OCL-Capacity-Decision': 'admitted', 'X-OCL-Capacity-Suggested-Concurrency': '2'}
    assert Capacity.from_headers(ours).room is None and Capacity.from_headers(ours).suggested == 2
    assert not Capacity.from_headers({'RateLimit': 'nonsense;;'}).counted
