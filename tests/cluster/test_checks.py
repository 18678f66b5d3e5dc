"""The cluster run's checks (cluster/checks.py) on data made here, each once with the violation it exists to
catch planted in it (it must fail) and once without (it must pass): two runs of one work at once, a lane over
its limit or a call let through uncounted outside the failover's window, a /readyz that lies through a fault."""
import json
import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from cluster import checks
from common.jsonlog import JsonFormatter

T0 = datetime(2026, 12, 4, tzinfo=UTC)
LANES = {'api_heavy': 3, 'es2_knn': 2}


def at(seconds):
    return (T0 + timedelta(seconds=seconds)).timestamp()


def call(number, start, end, attempts=1, lanes=('api_heavy', 'es2_knn'), decision='admitted'):
    """A call admitted into `lanes`, open from `start` to `end` seconds after T0, run `attempts` times."""
    work = SimpleNamespace(finished_at=T0 + timedelta(seconds=end), worker='lane@worker1', attempts=attempts)
    admission = {'decision': decision, 'holding': decision == 'admitted',
                 'lanes': [(lane, f'{{hl}}:lane:{lane}', LANES[lane], 0) for lane in lanes]}
    return SimpleNamespace(pk=number, work_id=f'w{number}', work=work, created_at=T0 + timedelta(seconds=start),
                           admission=admission)


def rows(*calls):
    return {c.pk: c for c in calls}


# --- no lane over its limit outside the failover window

def test_two_works_taken_over_put_each_of_their_lanes_up_to_two_over():
    # es2_knn (limit 2) holds 4 at once, api_heavy (limit 3) 4: both within two works taken over
    calls = rows(call(1, 0, 60, attempts=2), call(2, 0, 60, attempts=2), call(3, 20, 40), call(4, 21, 40))
    check = checks.lanes_within_limits(calls)
    assert check.passed, check.detail
    assert 'es2_knn 4 of 2' in check.detail and 'api_heavy 4 of 3' in check.detail


def test_a_lane_further_over_than_its_works_taken_over_fails():
    # one work taken over, yet es2_knn holds 4 of 2
    calls = rows(call(1, 0, 60, attempts=2), call(2, 0, 60), call(3, 20, 40), call(4, 21, 40))
    check = checks.lanes_within_limits(calls)
    assert not check.passed
    assert 'es2_knn 4 of 2' in check.detail


def test_a_work_taken_over_excuses_only_the_lanes_it_is_in():
    # the work taken over is in api_heavy alone; es2_knn is one over with nothing to excuse it
    calls = rows(call(1, 0, 60, attempts=2, lanes=('api_heavy',)), call(2, 0, 60), call(3, 20, 40),
                 call(4, 21, 40))
    check = checks.lanes_within_limits(calls)
    assert not check.passed
    assert 'es2_knn 3 of 2' in check.detail and 'api_heavy 4 of 3' in check.detail


def test_a_lane_over_its_limit_inside_the_failover_window_passes_and_outside_it_fails():
    # es2_knn (limit 2) gets its 3rd and 4th call at 20 s and 21 s
    over = rows(call(1, 0, 60), call(2, 0, 60), call(3, 20, 40), call(4, 21, 40))
    assert checks.lanes_within_limits(rows(call(1, 0, 60), call(2, 10, 30))).detail.startswith('none over')
    assert checks.lanes_within_limits(over, window=(at(19), at(22))).passed
    # the window closed at 20.5 s: the call admitted at 21 s went over with the failover behind it
    late = checks.lanes_within_limits(over, window=(at(19), at(20.5)))
    assert not late.passed and 'es2_knn 4 of 2' in late.detail
    # a failover earlier in the fault excuses nothing later (the old check let any failover fault pass)
    assert not checks.lanes_within_limits(over, window=(at(5), at(8))).passed


def test_a_call_let_through_uncounted_outside_the_failover_window_fails():
    calls = rows(call(1, 0, 60), call(2, 10, 20, decision='unavailable'))
    assert checks.lanes_within_limits(calls, window=(at(9), at(12))).passed
    check = checks.lanes_within_limits(calls, window=(at(12), at(15)))
    assert not check.passed and '1 let through uncounted [2]' in check.detail


# --- no work runs twice at once

def line(work, attempt, host, started, seconds=None):
    """The JSON line a worker writes for a run (workers.execution.RunLine), through the service's formatter."""
    run = {'work': work, 'attempt': attempt, 'worker': f'es2_knn@{host} pid 7',
           'started': datetime.fromtimestamp(at(started), UTC).isoformat()}
    if seconds is not None:
        run['seconds'] = seconds
    record = logging.LogRecord('heavy_lanes', logging.INFO, __file__, 1, 'Heavy work %s: run', (work,), None)
    record.run = run
    return json.loads(JsonFormatter().format(record))


def works(*attempts):
    """The rows of works w1, w2... run `attempts[i]` times."""
    return {f'w{n}': SimpleNamespace(pk=f'w{n}', work_id=f'w{n}', work=SimpleNamespace(attempts=count))
            for n, count in enumerate(attempts, 1)}


def test_a_work_taken_over_after_its_node_was_killed_ran_twice_but_not_at_once():
    # w1's first run died with worker1 at 12 s (no end line); worker2 took it over at 30 s
    lines = [line('w1', 1, 'worker1', 10), line('w1', 2, 'worker2', 30), line('w1', 2, 'worker2', 30, 1.5),
             line('w2', 1, 'worker2', 11), line('w2', 1, 'worker2', 11, 0.4)]
    check = checks.runs_once(works(2, 1), checks.runs_of(lines), killed={'worker1': at(12)})
    assert check.passed, check.detail
    assert check.detail.startswith('2 works, 3 runs, 1 started twice')


def test_a_second_run_while_the_first_still_ran_fails_though_a_node_died():
    # worker1 was cut off at 12 s, but its run went on until 35 s: worker2's run from 30 s ran beside it
    lines = [line('w1', 1, 'worker1', 10), line('w1', 1, 'worker1', 10, 25.0), line('w1', 2, 'worker2', 30),
             line('w1', 2, 'worker2', 30, 1.5)]
    check = checks.runs_once(works(2), checks.runs_of(lines), cut_off={'worker1': at(12)})
    assert not check.passed and '1 at once' in check.detail
    # the same runs, the first ending at 29 s, one after the other
    lines[1] = line('w1', 1, 'worker1', 10, 19.0)
    assert checks.runs_once(works(2), checks.runs_of(lines), cut_off={'worker1': at(12)}).passed


def test_a_run_killed_after_the_next_one_began_ran_beside_it():
    lines = [line('w1', 1, 'worker1', 10), line('w1', 2, 'worker2', 30), line('w1', 2, 'worker2', 30, 1.5)]
    check = checks.runs_once(works(2), checks.runs_of(lines), killed={'worker1': at(31)})
    assert not check.passed and '1 at once' in check.detail


def test_a_run_that_never_ended_on_a_node_that_lived_fails():
    lines = [line('w1', 1, 'worker1', 10)]
    check = checks.runs_once(works(1), checks.runs_of(lines))
    assert not check.passed and '1 never ended on a node that lived' in check.detail


def test_a_work_run_again_though_the_node_of_its_first_run_lived_fails():
    lines = [line('w1', 1, 'worker1', 10), line('w1', 1, 'worker1', 10, 1.0), line('w1', 2, 'worker2', 30),
             line('w1', 2, 'worker2', 30, 1.5)]
    check = checks.runs_once(works(2), checks.runs_of(lines), killed={'worker2': at(12)})
    assert not check.passed and '1 again while the node of the run before lived' in check.detail


def test_a_run_the_row_counts_but_no_line_shows_fails():
    # a node died, so a second run is allowed: but the row counts two and the lines show one
    lines = [line('w1', 2, 'worker2', 30), line('w1', 2, 'worker2', 30, 1.5)]
    check = checks.runs_once(works(2), checks.runs_of(lines), killed={'worker1': at(12)})
    assert not check.passed and "w1 (1 of 2 runs)" in check.detail


# --- each host's /readyz tells the truth

def read(host, status, sent, took=0.05):
    return (host, status, at(sent), at(sent + took))


def test_a_host_out_by_its_own_fault_may_say_anything_and_the_other_must_stay_ready():
    # api1 killed at 10 s, started at 15 s, ready at 18 s
    unready, down = [('api1', at(10), at(18))], [('api1', at(10), at(15))]
    reads = [read('api1', 200, 9), read('api1', 0, 11, 3), read('api1', '503 database=OperationalError', 16),
             read('api1', 200, 19), read('api2', 200, 11), read('api2', 200, 16)]
    final = [read('api1', 200, 40), read('api2', 200, 40)]
    check = checks.readiness(reads, final, unready, down)
    assert check.passed, check.detail
    # planted: api2 out while api1 is killed (the old check judged only the read at the end for this fault)
    check = checks.readiness(reads + [read('api2', '503 lanes=ConnectionError', 12)], final, unready, down)
    assert not check.passed and "('api2', '503 lanes=ConnectionError'" in check.detail


def test_a_host_that_says_ready_while_it_is_down_lies():
    down = [('api1', at(10), at(15)), ('api2', at(10), at(15))]  # the database stopped
    unready = [('api1', at(9), at(18)), ('api2', at(9), at(18))]
    assert not checks.readiness([read('api1', 200, 12)], [], unready, down).passed
    # a read that began before the stop isn't judged as down
    assert checks.readiness([read('api1', 200, 9.9, 0.2)], [], unready, down).passed


def test_a_host_out_through_a_worker_hosts_fault_or_after_a_failover_window_fails():
    assert not checks.readiness([read('api1', '503 broker=TimeoutError', 20)], [read('api1', 200, 40)]).passed
    window = [('api1', at(10), at(13)), ('api2', at(10), at(13))]
    assert checks.readiness([read('api1', '503 lanes=ConnectionError', 11)], [], window).passed
    # 503 again 10 s after every host reached the new primary: a connection the failover left broken
    assert not checks.readiness([read('api2', '503 broker=ConnectionError', 23)], [], window).passed
    assert not checks.readiness([], [read('api1', 0, 40)]).passed  # not back at the end


# --- the plants every cluster run makes in its own data (cluster/planted.py)

def test_every_plant_in_a_faults_real_data_is_caught():
    from cluster.faults import Effect
    from cluster.planted import plant
    calls = rows(call(1, 0, 3), call(2, 1, 4))
    for c in calls.values():
        c.work.worker = 'es2_knn@worker1 pid 7'
    runs = checks.runs_of([line('w1', 1, 'worker1', 1, 1.5), line('w2', 1, 'worker1', 2, 1.5)])
    reads = [read('api1', 200, 1), read('api2', 200, 1)]
    effect = Effect()
    assert checks.runs_once(calls, runs).passed and checks.lanes_within_limits(calls).passed
    assert checks.readiness(reads, reads).passed
    plants = plant(calls, runs, effect, reads, reads)
    assert [p.caught for p in plants] == [True, True, True], plants
