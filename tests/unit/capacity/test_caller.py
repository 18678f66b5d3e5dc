"""LIMITER.md §8 CapacityHelpersTest 1-3: tiers, the queue wait read from X-Amzn-Trace-Id, event metadata."""
import json

import pytest

from capacity.caller import (
    RequestFacts, clear_tiers, get_queue_ms, get_tier, parse_event_metadata, run_id_too_long, truncate,
)

NOW = 1_700_000_000


def trace(seconds_ago, field='Root'):
    return f'{field}=1-{format(int(NOW - seconds_ago), "x")}-abcdef0123456789'


@pytest.mark.django_db
def test_get_tier(make_user):
    assert get_tier(make_user(is_staff=True)) == 'staff'
    assert get_tier(make_user(is_superuser=True)) == 'staff'
    assert get_tier(make_user('core_user')) == 'core'
    assert get_tier(make_user('early_access')) == 'early_access'
    assert get_tier(make_user('preview')) == 'preview'
    assert get_tier(make_user()) == 'preview'
    both = make_user('preview')
    both.groups.add(*make_user('core_user').groups.all())
    clear_tiers()
    assert get_tier(both) == 'core'  # the highest plan wins


@pytest.mark.django_db
def test_a_tier_is_cached_until_the_cache_period_ends(make_user, settings, django_assert_num_queries):
    user = make_user('core_user')
    assert get_tier(user) == 'core'
    with django_assert_num_queries(0):
        assert get_tier(user) == 'core'
    settings.CAPACITY_CONFIG_CACHE_SECONDS = 0
    clear_tiers()
    get_tier(user)
    with django_assert_num_queries(1):
        get_tier(user)


def test_get_queue_ms():
    assert get_queue_ms(trace(2.5), now=NOW) == 3000  # whole-second stamps read up to 1 s high
    assert get_queue_ms(f'Root=1-{format(NOW, "x")}-a', now=NOW + 2.5) == 2500
    assert get_queue_ms(f'{trace(9)};Self=1-{format(NOW - 1, "x")}-b', now=NOW) == 1000  # Self wins
    assert get_queue_ms(trace(-1), now=NOW) == 0  # a clock a little ahead clamps to 0
    assert get_queue_ms(trace(7200), now=NOW) is None  # implausible
    assert get_queue_ms(None) is None and get_queue_ms('') is None
    for bad in ('Root=1-zzzz-1', 'Root=nope', 'garbage', ';;==;', 'Root='):
        assert get_queue_ms(bad, now=NOW) is None
    assert get_queue_ms(f'Self=1-{format(NOW - 3, "x")}-x; Root=1-0-y', now=NOW) == 3000  # space after ;


def test_parse_event_metadata():
    assert parse_event_metadata(None) == {} and parse_event_metadata('') == {}
    assert parse_event_metadata('{not json') == {}
    assert parse_event_metadata('[1]') == {} and parse_event_metadata('"x"') == {}
    assert parse_event_metadata('{"capacity_aware": "true"}') == {'capacity_aware': 'true'}


def test_truncate():
    assert truncate(None, 5) is None and truncate('', 5) is None
    assert truncate('abcdefgh', 5) == 'abcde' and truncate(12345678, 3) == '123'


@pytest.mark.parametrize('value', ['a\x00b', '\ud800', 'id-\udfff', '\x00'])
def test_text_a_database_cant_store_reads_as_absent(value):
    assert truncate(value, 100) is None


def test_metadata_values_a_database_cant_store_are_left_out_of_the_facts():
    facts = RequestFacts.from_meta({'HTTP_X_OCL_EVENT_METADATA': json.dumps(
        {'capacity_aware': 'true', 'algorithm_id': 'a\x00b', 'automatch_run_id': '\ud800'})})
    assert facts.aware is True  # the rest of the header still counts
    assert facts.algorithm_id is None and facts.automatch_run_id is None


@pytest.mark.parametrize('run, too_long', [
    ('r' * 255, False),        # the longest kept, whole
    ('r' * 256, True),         # the API refuses it rather than cut it short
    (None, False),             # no run
    ({'nested': 'r' * 300}, False),  # not an id: read as no run
    (12345, False),
])
def test_a_run_id_is_kept_whole_up_to_255_characters_and_a_longer_one_is_told(run, too_long):
    meta = {'HTTP_X_OCL_EVENT_METADATA': json.dumps({'automatch_run_id': run, 'pad': 'x' * 300})}
    assert run_id_too_long(meta) is too_long
    if not too_long and isinstance(run, str):
        assert RequestFacts.from_meta(meta).automatch_run_id == run
