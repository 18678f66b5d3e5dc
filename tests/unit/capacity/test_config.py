"""The config schema: defaults, validation, merge, diff and resolve. Pure: no database, no Redis."""
import logging

import pytest
from django.core.exceptions import ValidationError

from capacity.config import diff, get_defaults, merge, nest, resolve, validate
from capacity.defaults import DEFAULTS, Config

RETRY_AFTER_RULE = ('"retry_after" needs "base", "min" and "paused" of at least 1, and "max" of at least '
                    '"base" and "min".')


def errors_of(config):
    with pytest.raises(ValidationError) as caught:
        validate(config)
    return caught.value.messages


def changed(**changes):
    return merge(get_defaults(), changes)


def test_defaults_are_the_starting_numbers():
    defaults = get_defaults()
    assert validate(defaults) is defaults
    assert defaults['mode'] == 'shadow'
    assert defaults['enforce_for'] == 'aware'
    assert defaults['api_heavy'] == {'cluster': 4, 'per_task': 64}  # per_task: what one API host holds waiting
    assert defaults['es2_knn'] == 3
    assert defaults['reserve_single_row'] == 1
    assert defaults['tiers'] == {'staff': 4, 'core': 4, 'early_access': 3, 'preview': 2}
    assert defaults['per_user'] == {'staff': 4, 'core': 3, 'early_access': 2, 'preview': 1}
    assert (defaults['lease_seconds'], defaults['renew_seconds'], defaults['max_hold_seconds']) == (60, 20, 900)
    assert defaults['retry_after'] == {'base': 5, 'min': 1, 'max': 30, 'paused': 120, 'measured': 1}
    assert defaults['queue'] == {'deadline_seconds': 600,
                                 'max_waiting': {'interactive': 0, 'es2_knn': 0, 'api_heavy': 0}}
    assert defaults['wait'] == {'default_seconds': 600, 'max_seconds': 900}


def test_the_defaults_are_a_copy_nobody_can_change_by_accident():
    get_defaults()['tiers']['preview'] = 99
    assert get_defaults()['tiers']['preview'] == 2
    assert DEFAULTS['tiers']['preview'] == 2


@pytest.mark.parametrize('mode, expected', [('off', 'off'), ('enforce', 'enforce'), ('loud', 'shadow')])
def test_default_mode_comes_from_settings_when_it_is_a_mode(settings, mode, expected):
    settings.CAPACITY_LIMIT_MODE = mode
    assert get_defaults()['mode'] == expected


@pytest.mark.parametrize('changes, message', [
    ({'bogus': 1}, 'Unknown setting "bogus".'),
    ({'tiers': {'gold': 1}}, 'Unknown setting "tiers.gold".'),
    ({'tiers': 5}, 'tiers must be an object.'),
    ({'queue': {'max_waiting': 2}}, 'queue.max_waiting must be an object.'),
    ({'queue': {'max_waiting': {'gold': 1}}}, 'Unknown setting "queue.max_waiting.gold".'),
    ({'mode': 'loud'}, '"mode" must be one of off, shadow, enforce.'),
    ({'enforce_for': 'some'}, '"enforce_for" must be one of aware, all.'),
    ({'es2_knn': -1}, '"es2_knn" must be a whole number from 0 to 100000.'),
    ({'es2_knn': True}, '"es2_knn" must be a whole number from 0 to 100000.'),
    ({'es2_knn': '3'}, '"es2_knn" must be a whole number from 0 to 100000.'),
    ({'es2_knn': 2.5}, '"es2_knn" must be a whole number from 0 to 100000.'),
    ({'es2_knn': None}, '"es2_knn" must be a whole number from 0 to 100000.'),
    ({'per_user': {'preview': 100001}}, '"per_user.preview" must be a whole number from 0 to 100000.'),
    ({'queue': {'max_waiting': {'interactive': -1}}},
     '"queue.max_waiting.interactive" must be a whole number from 0 to 100000.'),
    ({'reserve_single_row': 5}, '"reserve_single_row" can\'t be more than "api_heavy.cluster".'),
    ({'lease_seconds': 14, 'renew_seconds': 1}, '"lease_seconds" must be at least 15.'),
    ({'renew_seconds': 21}, '"renew_seconds" must be at least 1 and at most a third of "lease_seconds".'),
    ({'renew_seconds': 0}, '"renew_seconds" must be at least 1 and at most a third of "lease_seconds".'),
    ({'max_hold_seconds': 30}, '"max_hold_seconds" can\'t be less than "lease_seconds".'),
    ({'retry_after': {'base': 0}},
     RETRY_AFTER_RULE),
    ({'retry_after': {'paused': 0}},
     RETRY_AFTER_RULE),
    ({'retry_after': {'base': 10, 'max': 5}},
     RETRY_AFTER_RULE),
    ({'retry_after': {'min': 0}},
     RETRY_AFTER_RULE),
    ({'retry_after': {'min': 31}},  # more than max
     RETRY_AFTER_RULE),
    ({'retry_after': {'measured': 2}},
     '"retry_after.measured" must be 1 (from measured hold times) or 0 (the base alone).'),
    ({'queue': {'deadline_seconds': 59}}, '"queue.deadline_seconds" can\'t be less than "lease_seconds".'),
    ({'wait': {'max_seconds': 3601}}, '"wait.max_seconds" can\'t be more than 3600.'),
    ({'wait': {'default_seconds': 901}}, '"wait.default_seconds" can\'t be more than "wait.max_seconds".'),
])
def test_validate_rejects_a_bad_change_with_its_message(changes, message):
    assert errors_of(changed(**changes)) == [message]


@pytest.mark.parametrize('changes', [
    {'lease_seconds': 15, 'renew_seconds': 5, 'max_hold_seconds': 15, 'queue': {'deadline_seconds': 15}},
    {'reserve_single_row': 4},
    {'queue': {'deadline_seconds': 60}},
    {'wait': {'max_seconds': 3600, 'default_seconds': 3600}},
    {'retry_after': {'base': 1, 'min': 1, 'max': 1, 'paused': 1, 'measured': 0}},
    {'tiers': {'preview': 0}, 'per_user': {'preview': 100000}},
])
def test_validate_accepts_the_edges_of_each_rule(changes):
    config = changed(**changes)
    assert validate(config) is config


def test_validate_collects_every_shape_error_and_skips_the_rules_until_the_shape_is_right():
    config = changed(bogus=1, es2_knn=-1, tiers=5, reserve_single_row=50)
    del config['mode']
    assert sorted(errors_of(config)) == sorted([
        'Unknown setting "bogus".',
        '"mode" is required.',
        '"es2_knn" must be a whole number from 0 to 100000.',
        'tiers must be an object.',
    ])


def test_validate_collects_every_broken_rule():
    assert errors_of(changed(reserve_single_row=5, max_hold_seconds=30, wait={'max_seconds': 4000})) == [
        '"reserve_single_row" can\'t be more than "api_heavy.cluster".',
        '"max_hold_seconds" can\'t be less than "lease_seconds".',
        '"wait.max_seconds" can\'t be more than 3600.',
    ]


def test_validate_needs_every_setting_and_an_object():
    assert '"mode" is required.' in errors_of({})
    config = get_defaults()
    config['tiers'] = {'staff': 4, 'core': 4, 'early_access': 3}
    assert errors_of(config) == ['"tiers.preview" is required.']
    assert errors_of([]) == ['config must be an object.']


def test_merge_is_deep_and_leaves_its_base_alone():
    base = {'a': 1, 'b': {'c': 2, 'd': 3}}
    assert merge(base, {'b': {'c': 5}, 'e': 6}) == {'a': 1, 'b': {'c': 5, 'd': 3}, 'e': 6}
    assert merge(base, {'b': {'c': 5, 'x': 1}, 'e': 6}, known_only=True) == {'a': 1, 'b': {'c': 5, 'd': 3}}
    assert merge(base, None) == base
    assert base == {'a': 1, 'b': {'c': 2, 'd': 3}}
    merged = merge(base, {})
    merged['b']['c'] = 9
    assert base['b']['c'] == 2


def test_diff_lists_each_changed_leaf_by_its_dotted_path():
    old = {'mode': 'shadow', 'tiers': {'preview': 2, 'core': 4}}
    new = {'mode': 'off', 'tiers': {'preview': 1, 'core': 4}, 'es2_knn': 3}
    assert diff(old, new) == {'es2_knn': [None, 3], 'mode': ['shadow', 'off'], 'tiers.preview': [2, 1]}
    assert list(diff(old, new)) == ['es2_knn', 'mode', 'tiers.preview']
    assert diff(None, {'a': 1}) == {'a': [None, 1]}
    assert diff({'a': {'b': 1}}, None) == {'a.b': [1, None]}
    assert diff({'a': {'b': 1}}, {'a': 5}) == {'a': [{'b': 1}, 5]}
    assert diff(new, merge(new, {})) == {}


def test_nest_turns_a_dotted_setting_into_nested_objects():
    assert nest('tiers.preview', 1) == {'tiers': {'preview': 1}}
    assert nest('mode', 'off') == {'mode': 'off'}


def test_resolve_fills_in_the_defaults_and_drops_retired_settings():
    assert resolve(None) == get_defaults()
    assert resolve({'retired': 1, 'tiers': {'preview': 1, 'gold': 9}}) == merge(
        get_defaults(), {'tiers': {'preview': 1}})


@pytest.mark.parametrize('stored, errors', [
    ({'es2_knn': -1, 'reserve_single_row': 2.5},
     '"es2_knn" must be a whole number from 0 to 100000.; '
     '"reserve_single_row" must be a whole number from 0 to 100000.'),
    ({'tiers': 5}, 'tiers must be an object.'),
    (['mode', 'off'], 'config must be an object.'),
])
def test_resolve_falls_back_to_the_defaults_and_logs_an_invalid_stored_config(caplog, stored, errors):
    with caplog.at_level(logging.ERROR, logger='heavy_lanes'):
        assert resolve(stored) == get_defaults()
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == f'Capacity config is invalid ({errors}); using the defaults'


def test_the_time_limits_follow_max_hold_and_the_leases_outlive_the_hard_one():
    from capacity.config import time_limits
    limits = time_limits(Config())
    assert (limits.soft, limits.hard) == (900, 920)
    assert time_limits(Config.from_json(changed(max_hold_seconds=60))).hard == 80
    # The last renewal (at most renew_seconds before the soft limit) is still held at the hard limit.
    assert limits.soft - DEFAULTS['renew_seconds'] + DEFAULTS['lease_seconds'] > limits.hard


@pytest.mark.parametrize('changes, visibility, problem', [
    ({}, 3600, False),                                                   # 600 + 920 < 3600
    ({'max_hold_seconds': 2980}, 3600, True),                            # 600 + 2980 + 20 = 3600: too long
    ({'max_hold_seconds': 2979}, 3600, False),                           # 3599: just under
    ({'queue': {'deadline_seconds': 3000, 'max_waiting': DEFAULTS['queue']['max_waiting']}}, 3600, True),
    ({}, 1520, True),                                                    # exactly the visibility timeout
])
def test_a_config_whose_calls_could_outlast_the_visibility_timeout_is_a_broker_problem(
        changes, visibility, problem):
    from capacity.config import broker_problems
    assert bool(broker_problems(Config.from_json(changed(**changes)), visibility)) is problem


def test_the_typed_config_reads_by_attribute_and_an_unknown_name_raises():
    import dataclasses

    from capacity.constants import QUEUES, TIERS
    config = Config.from_json(changed(api_heavy={'cluster': 7, 'per_task': 64}, tiers={'preview': 1}))
    assert (config.api_heavy.cluster, config.tiers.preview, config.tiers['preview']) == (7, 1, 1)
    assert config.to_json() == changed(api_heavy={'cluster': 7, 'per_task': 64}, tiers={'preview': 1})
    with pytest.raises(AttributeError):
        config.api_heavy.clustr  # noqa: B018 - a misspelt setting is an error, not a missing value
    with pytest.raises(KeyError):
        config.tiers['nobody']
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mode = 'enforce'
    # The sections keyed by name are the tiers and the queues, in the vocabulary's order.
    assert config.tiers.names() == TIERS and config.queue.max_waiting.names() == QUEUES
    assert Config().to_json() == DEFAULTS
