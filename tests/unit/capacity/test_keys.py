"""Key names: one prefix, one hash tag, so every key of the lanes shares one Redis Cluster slot."""
import fnmatch

import pytest
from redis.crc import key_slot

from capacity.constants import Lane
from capacity.keys import escape_glob, expired_key, lane_id, lane_key, lane_pattern


def test_lane_keys_join_the_tagged_prefix_the_lane_and_its_parts(settings):
    settings.CAPACITY_KEY_PREFIX = 'ocl:capacity'
    assert lane_key(Lane.API_HEAVY) == '{ocl:capacity}:api_heavy'
    assert lane_key('api_heavy') == '{ocl:capacity}:api_heavy'
    assert lane_key(Lane.USER, 42) == '{ocl:capacity}:user:42'
    assert lane_key(Lane.API_HEAVY_TASK, 'web-1') == '{ocl:capacity}:api_heavy_task:web-1'
    assert lane_key(Lane.TIER, 'early_access') == '{ocl:capacity}:tier:early_access'
    assert expired_key() == '{ocl:capacity}:stats:expired'


def test_the_prefix_is_read_when_a_key_is_made(settings):
    settings.CAPACITY_KEY_PREFIX = 'one'
    assert lane_key(Lane.ES2_KNN) == '{one}:es2_knn'
    settings.CAPACITY_KEY_PREFIX = 'two'
    assert lane_key(Lane.ES2_KNN) == '{two}:es2_knn'
    assert expired_key() == '{two}:stats:expired'


def test_every_key_of_a_prefix_lands_in_one_cluster_slot(settings):
    settings.CAPACITY_KEY_PREFIX = 'ocl:capacity'
    keys = [lane_key(Lane.API_HEAVY), lane_key(Lane.API_HEAVY_TASK, 'web-1'), lane_key(Lane.ES2_KNN),
            lane_key(Lane.TIER, 'preview'), lane_key(Lane.USER, 42), lane_key(Lane.USER, 43), expired_key()]
    assert {key_slot(key.encode()) for key in keys} == {key_slot(b'ocl:capacity')}
    # Without the tag the same names scatter, so the tag is what keeps a call's keys together.
    assert len({key_slot(key.replace('{', '').replace('}', '').encode()) for key in keys}) > 1


@pytest.mark.parametrize('prefix', ['', '}ocl', 'ocl{x}', 'a}b'])
def test_a_prefix_that_would_break_the_hash_tag_is_refused(settings, prefix):
    settings.CAPACITY_KEY_PREFIX = prefix
    with pytest.raises(ValueError, match='CAPACITY_KEY_PREFIX'):
        lane_key(Lane.API_HEAVY)


def test_a_lane_pattern_matches_the_lanes_keys_with_parts_only(settings):
    settings.CAPACITY_KEY_PREFIX = 'ocl:capacity'
    pattern = lane_pattern(Lane.USER)
    assert pattern == '{ocl:capacity}:user:*'
    assert fnmatch.fnmatchcase(lane_key(Lane.USER, 7), pattern)
    assert not fnmatch.fnmatchcase(lane_key(Lane.API_HEAVY), pattern)
    assert not fnmatch.fnmatchcase(lane_key('user_x', 7), pattern)


def test_glob_characters_in_the_prefix_are_escaped(settings):
    settings.CAPACITY_KEY_PREFIX = 'a*b?[c]\\d'
    assert lane_pattern(Lane.USER) == '{a\\*b\\?\\[c\\]\\\\d}:user:*'
    assert escape_glob('plain:text') == 'plain:text'


def test_the_id_is_the_part_after_the_last_colon(settings):
    settings.CAPACITY_KEY_PREFIX = 'ocl:capacity'
    assert lane_id(lane_key(Lane.USER, 42)) == '42'
    assert lane_id(lane_key(Lane.API_HEAVY_TASK, 'web-1').encode()) == 'web-1'
