"""`manage.py capacity show|set|reset|history`."""
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from capacity.config import get_defaults
from capacity.models import CapacityConfig

pytestmark = pytest.mark.django_db


def capacity(*args):
    out = StringIO()
    call_command('capacity', *args, stdout=out)
    return json.loads(out.getvalue())


def test_show_set_reset_and_history(make_user, config_lines):
    assert capacity('show') == {'version': None, 'config': get_defaults()}

    changed = capacity('set', 'tiers.preview=1', 'mode=enforce', '--note', 'test')
    row = CapacityConfig.get_latest()
    assert changed == {'version': row.id, 'changes': {'mode': ['shadow', 'enforce'], 'tiers.preview': [2, 1]}}
    assert (row.source, row.note, row.created_by) == ('command', 'test', None)
    assert config_lines[-1]['source'] == 'command'
    assert capacity('show') == {'version': row.id, 'config': row.config}

    staff = make_user(username='grace', is_staff=True)
    reset = capacity('reset', '--user', 'grace')
    assert reset['changes'] == {'mode': ['enforce', 'shadow'], 'tiers.preview': [1, 2]}
    assert CapacityConfig.get_latest().created_by == staff
    assert CapacityConfig.get_latest().config == get_defaults()

    history = capacity('history', '--limit', '5')
    assert [item['version'] for item in history] == [reset['version'], row.id]
    assert history[0]['created_by'] == 'grace'
    assert history[1]['changes'] == {'mode': ['shadow', 'enforce'], 'tiers.preview': [2, 1]}
    assert history[1]['note'] == 'test'
    assert history[1]['created_at'] == row.created_at.isoformat()
    assert len(capacity('history', '--limit', '1')) == 1


def test_set_merges_several_settings_of_one_object_and_reads_whole_numbers():
    changed = capacity('set', 'tiers.preview=0', 'tiers.core=3', 'retry_after.base=7', 'enforce_for=all')
    assert changed['changes'] == {
        'enforce_for': ['aware', 'all'], 'retry_after.base': [5, 7], 'tiers.core': [4, 3], 'tiers.preview': [2, 0]}


def test_setting_the_value_in_force_adds_no_version(config_lines):
    assert capacity('set', 'es2_knn=3') == {'version': None, 'changes': {}}
    assert CapacityConfig.objects.count() == 0
    assert config_lines == []


@pytest.mark.parametrize('args, message', [
    (['set'], 'Give at least one <setting>=<value>.'),
    (['set', 'mode'], 'Expected <setting>=<value>, got "mode".'),
    (['set', '=1'], 'Expected <setting>=<value>, got "=1".'),
    (['set', 'es2_knn=-1'], '"es2_knn" must be a whole number from 0 to 100000.'),
    (['set', 'es2_knn=--1'], '"es2_knn" must be a whole number from 0 to 100000.'),
    (['set', 'es2_knn=two', 'bogus=1'],
     'Unknown setting "bogus". "es2_knn" must be a whole number from 0 to 100000.'),
    (['set', 'wait.max_seconds=3601'], '"wait.max_seconds" can\'t be more than 3600.'),
    (['set', 'mode=off', '--user', 'nobody'], 'No user "nobody".'),
    (['reset', '--user', 'nobody'], 'No user "nobody".'),
    (['show', 'mode=off'], '"show" takes no <setting>=<value>.'),
])
def test_errors(config_lines, args, message):
    with pytest.raises(CommandError) as caught:
        call_command('capacity', *args, stdout=StringIO())
    assert str(caught.value) == message
    assert CapacityConfig.objects.count() == 0
    assert config_lines == []
