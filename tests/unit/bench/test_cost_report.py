"""The cost benchmark's arithmetic (bench/cost_report.py): a kind's figures per call are its window's change
less the idle stack's rate over as long, the benchmark's own INFO taken out."""
import pytest

from bench.cost_report import (
    CLIENT, KEYS, Snapshot, add, delta, figures, idle_figures, net, process_group, rates, scaled,
)


def snap(at, commands=None, cpu=0.0, trips=None, statements=0, commits=0, cpu_s=None, command_s=0.0):
    return Snapshot(at=at, commands=commands or {}, redis_cpu_s=cpu, round_trips=trips or {},
                    pg_statements=statements, pg_commits=commits, cpu_s=cpu_s or {}, redis_command_s=command_s)


def test_a_window_leaves_out_the_info_command_and_round_trip_of_its_own_first_snapshot():
    before = snap(100.0, {'info': 7, 'evalsha': 10}, trips={CLIENT: 7, 'api': 50})
    after = snap(102.5, {'info': 8, 'evalsha': 17, 'lpush': 2}, trips={CLIENT: 8, 'api': 59})
    change = delta(before, after)
    assert change.at == 2.5
    assert change.commands == {'info': 0, 'evalsha': 7, 'lpush': 2}
    assert change.round_trips == {CLIENT: 0, 'api': 9}


def test_the_idle_rate_over_the_windows_length_is_taken_away_before_dividing_by_the_calls():
    # Idle: 20 s in which Redis ran 40 BRPOPs and 2 ms of CPU, a consumer made 40 round trips, PostgreSQL
    # 10 statements and 10 commits, the consumer used 0.2 s of CPU.
    idle = snap(20.0, {'brpop': 40}, cpu=0.002, trips={'interactive consumer': 40}, statements=10, commits=10,
                cpu_s={'interactive consumer': 0.2}, command_s=0.0004)
    # 10 calls in 5 s: 10 of those BRPOPs are the idle stack's, the rest the calls'.
    window = snap(5.0, {'brpop': 20, 'evalsha': 70, 'info': 0}, cpu=0.0125,
                  trips={'interactive consumer': 30, 'api': 40, CLIENT: 0}, statements=62.5, commits=32.5,
                  cpu_s={'interactive consumer': 0.25, 'api': 0.1}, command_s=0.0031)
    result = figures(net(window, rates(idle)), calls=10)
    assert result['redis_commands'] == 8.0           # (20 - 10 + 70) / 10
    assert result['redis_script_calls'] == 7.0
    assert result['redis_commands_by_name'] == {'evalsha': 7.0, 'brpop': 1.0}   # info nets to 0: left out
    assert result['redis_round_trips'] == 6.0        # (30 - 10 + 40) / 10
    assert result['redis_round_trips_by_process'] == {'api': 4.0, 'interactive consumer': 2.0}
    assert result['redis_cpu_us'] == 1200.0          # (12.5 ms - 0.5 ms) / 10
    assert result['redis_command_us'] == 300.0       # (3.1 ms - 0.1 ms) / 10
    assert result['pg_statements'] == 6.0            # (62.5 - 2.5) / 10
    assert result['pg_commits'] == 3.0
    assert result['cpu_ms_by_process'] == {'api': 10.0, 'interactive consumer': 20.0}
    assert result['cpu_ms'] == 30.0
    assert (result['calls'], result['seconds']) == (10, 5.0)


def test_the_figures_carry_the_issues_keys_first():
    result = figures(snap(1.0, {'get': 2}), calls=2)
    assert tuple(result)[:len(KEYS)] == KEYS


def test_two_idle_windows_make_one_rate_over_their_total_length():
    first, second = snap(10.0, {'brpop': 10}, trips={'api': 4}), snap(30.0, {'brpop': 30, 'ping': 2})
    both = add(first, second)
    assert (both.at, both.commands, both.round_trips) == (40.0, {'brpop': 40, 'ping': 2}, {'api': 4})
    assert rates(both).commands == {'brpop': 1.0, 'ping': 0.05}
    assert idle_figures(both)['redis_commands_per_s'] == 1.1
    assert idle_figures(both)['seconds'] == 40.0


def test_a_difference_of_two_windows_is_the_extra_calls_cost():
    # coalesced = pairs less their leaders alone: only what the joining call added is left.
    leaders = snap(12.0, {'evalsha': 280, 'lpush': 40})
    pairs = snap(16.0, {'evalsha': 400, 'lpush': 40, 'subscribe': 40})
    extra = add(pairs, scaled(leaders, -1))
    assert figures(extra, calls=40)['redis_commands_by_name'] == {'evalsha': 3.0, 'subscribe': 1.0}


@pytest.mark.parametrize(('pid', 'pgid', 'expected'), [
    (500, 77, CLIENT),                   # the benchmark's own process, whatever its group
    (10, 10, 'api'),                     # gunicorn's master
    (11, 10, 'api'),                     # one of its workers
    (20, 20, 'interactive consumer'),    # a lane worker's main process
    (21, 20, 'interactive pool'),        # its pool process
    (30, 30, 'redis'),
    (99, 99, 'other'),                   # not a process of the stack
])
def test_a_process_counts_under_its_stack_childs_name(pid, pgid, expected):
    leaders = {10: 'api', 20: 'worker-interactive', 30: 'redis'}
    assert process_group(pid, pgid, leaders, client_pid=500) == expected
