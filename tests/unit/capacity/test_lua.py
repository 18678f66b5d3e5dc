"""The Lua scripts ship as package data and each documents its own contract in a header."""
import re

import pytest

from capacity.operations import PRELUDE_LINE, SCRIPTS, read_lua, read_script

PRELUDE = re.compile(r'^-- prelude .*?^-- end prelude$', re.MULTILINE | re.DOTALL)


LANE_SCRIPTS = ('acquire', 'renew', 'release', 'count')  # the scripts of the lanes' sorted sets


def header_of(name):
    header = []
    for line in read_script(name).splitlines():
        if not line.startswith('--'):
            break
        header.append(line)
    return header


@pytest.mark.parametrize('name', SCRIPTS)
def test_each_script_opens_with_a_header_naming_its_data_keys_and_return(name):
    header = header_of(name)
    assert header[0].startswith(f'-- {name.upper()}:')
    text = '\n'.join(header)
    for word in ('Data:', 'KEYS[1', 'Returns'):
        assert word in text, f'{name}.lua header lacks {word!r}'


@pytest.mark.parametrize('name', LANE_SCRIPTS)
def test_each_lane_script_names_the_lanes_data(name):
    text = '\n'.join(header_of(name))
    for word in ('sorted set', 'member = lease token', 'score', 'epoch ms', 'KEYS[1..n]'):
        assert word in text, f'{name}.lua header lacks {word!r}'


@pytest.mark.parametrize('name', SCRIPTS)
def test_every_argv_is_documented_and_bound_to_a_named_local(name):
    source = read_script(name)
    used = sorted(set(re.findall(r'ARGV\[(\d+)\]', PRELUDE.sub('', source.split('\n\n', 1)[1]))))
    for index in used:
        assert re.search(rf'^-- ARGV\[{index}\] +\w+', source, re.MULTILINE), f'ARGV[{index}] of {name}'
        assert re.search(rf'^local \w+ = .*ARGV\[{index}\]', source, re.MULTILINE), f'ARGV[{index}] of {name}'


def test_the_scripts_that_read_the_clock_share_one_prelude():
    preludes = {name: PRELUDE.search(read_script(name)) for name in SCRIPTS}
    with_clock = {name: match.group(0) for name, match in preludes.items() if match}
    # release reads it to measure how long the leases it removes were held; rate stamps each request.
    assert set(with_clock) == {'acquire', 'renew', 'release', 'count', 'rate'}
    assert len(set(with_clock.values())) == 1, 'the prelude drifted between scripts'
    assert "redis.call('TIME')" not in read_script('unclaim')


@pytest.mark.parametrize('name', ('acquire', 'renew', 'release', 'count', 'rate'))
def test_the_prelude_is_written_once_and_put_in_each_script_that_reads_the_clock(name):
    own = read_lua(name)
    assert own.splitlines().count(PRELUDE_LINE) == 1
    assert "redis.call('TIME')" not in own and 'local function keep' not in own
    assert read_lua('prelude') in read_script(name) + '\n'
    assert PRELUDE_LINE not in read_script(name).splitlines()
