"""What a call costs, from counter readings taken before and after a run of calls (bench/cost.py): pure
arithmetic on snapshots, no services.

A `Snapshot` is every counter read at one moment: Redis's commands by name (`INFO commandstats`, the
commands scripts run included), its CPU (`used_cpu_sys + used_cpu_user`) and the commands' own time (their
`usec`), the round trips each group of
processes counted at the client (api/bench_round_trips.py), PostgreSQL's statements (pg_stat_statements)
and commits (`xact_commit`) in the bench database, and the CPU each group of processes used. `delta` is
what changed between two; `per_call` divides a window's change by its calls after taking away what the
stack does idle over as long (`rates` of an idle window), so a kind's figure is what its calls added.

The benchmark's own reading is taken out exactly: each snapshot sends one INFO from the benchmark's
process, so every window holds one INFO command and one round trip of the client that the calls didn't
make (`OWN_INFO`).
"""
import dataclasses

SCRIPT_COMMANDS = ('evalsha', 'eval', 'evalsha_ro', 'eval_ro', 'fcall', 'fcall_ro')
CLIENT = 'client'  # this benchmark's process: the HTTP client, and the Celery user of `plain_celery`
OWN_INFO = 1  # INFO commands (and client round trips) a window holds from its first snapshot
KEYS = ('redis_commands', 'redis_round_trips', 'redis_cpu_us', 'pg_statements', 'pg_commits', 'cpu_ms_by_process')


@dataclasses.dataclass(frozen=True)
class Snapshot:
    at: float                 # monotonic seconds
    commands: dict            # {command name: calls}, Redis's own count since its start
    redis_cpu_s: float        # used_cpu_sys + used_cpu_user
    round_trips: dict         # {process group: round trips}, as counted by its processes
    pg_statements: int        # calls of every statement in the bench database (pg_stat_statements)
    pg_commits: int           # xact_commit of the bench database
    cpu_s: dict               # {process group: CPU seconds}
    redis_command_s: float = 0.0  # the commands' own time (commandstats `usec`), INFO's left out


def _diff(after, before):
    return {key: after.get(key, 0) - before.get(key, 0) for key in set(after) | set(before)}


def _sum(first, second):
    return {key: first.get(key, 0) + second.get(key, 0) for key in set(first) | set(second)}


def delta(before, after):
    """What changed from `before` to `after`, the benchmark's own INFO taken out: a Snapshot whose `at` is
    the seconds between them."""
    commands = _diff(after.commands, before.commands)
    commands['info'] = commands.get('info', 0) - OWN_INFO
    round_trips = _diff(after.round_trips, before.round_trips)
    round_trips[CLIENT] = round_trips.get(CLIENT, 0) - OWN_INFO
    return Snapshot(at=after.at - before.at, commands=commands, redis_cpu_s=after.redis_cpu_s - before.redis_cpu_s,
                    round_trips=round_trips, pg_statements=after.pg_statements - before.pg_statements,
                    pg_commits=after.pg_commits - before.pg_commits, cpu_s=_diff(after.cpu_s, before.cpu_s),
                    redis_command_s=after.redis_command_s - before.redis_command_s)


def add(first, second):
    """Two windows' changes as one (for several idle windows)."""
    return Snapshot(at=first.at + second.at, commands=_sum(first.commands, second.commands),
                    redis_cpu_s=first.redis_cpu_s + second.redis_cpu_s,
                    round_trips=_sum(first.round_trips, second.round_trips),
                    pg_statements=first.pg_statements + second.pg_statements,
                    pg_commits=first.pg_commits + second.pg_commits, cpu_s=_sum(first.cpu_s, second.cpu_s),
                    redis_command_s=first.redis_command_s + second.redis_command_s)


def scaled(window, factor):
    """Every change of `window` times `factor` (its `at` too)."""
    def times(values):
        return {key: value * factor for key, value in values.items()}
    return Snapshot(at=window.at * factor, commands=times(window.commands), redis_cpu_s=window.redis_cpu_s * factor,
                    round_trips=times(window.round_trips), pg_statements=window.pg_statements * factor,
                    pg_commits=window.pg_commits * factor, cpu_s=times(window.cpu_s),
                    redis_command_s=window.redis_command_s * factor)


def rates(idle):
    """An idle window's changes per second."""
    return scaled(idle, 1 / idle.at)


def net(window, idle_rates):
    """A window's changes less what the idle stack does over as long (its `at` still the window's length)."""
    return dataclasses.replace(add(window, scaled(idle_rates, -window.at)), at=window.at)


def _rounded(values, digits=1, floor=0.05):
    """{key: value} rounded, largest first, dropping what rounds to nothing."""
    return {key: round(value, digits) for key, value in sorted(values.items(), key=lambda item: -item[1])
            if abs(value) >= floor}


def figures(change, calls):
    """One kind's figures per call from its net change over `calls` calls: the issue's keys, then the detail
    (commands by name, script calls, round trips by process)."""
    per = scaled(change, 1 / calls)
    commands = sum(per.commands.values())
    return {
        'redis_commands': round(commands, 1),
        'redis_round_trips': round(sum(per.round_trips.values()), 1),
        'redis_cpu_us': round(per.redis_cpu_s * 1e6, 1),
        'pg_statements': round(per.pg_statements, 1),
        'pg_commits': round(per.pg_commits, 1),
        'cpu_ms_by_process': _rounded({name: seconds * 1000 for name, seconds in per.cpu_s.items()}, 2, 0.005),
        'redis_script_calls': round(sum(per.commands.get(name, 0) for name in SCRIPT_COMMANDS), 1),
        # Redis's time in the commands themselves (no network or event loop): steadier than its CPU.
        'redis_command_us': round(per.redis_command_s * 1e6, 1),
        'redis_commands_by_name': _rounded(per.commands),
        'redis_round_trips_by_process': _rounded(per.round_trips),
        'cpu_ms': round(sum(per.cpu_s.values()) * 1000, 2),
        'calls': calls,
        'seconds': round(change.at, 1),
    }


def idle_figures(idle):
    """What the idle stack does per second, from its idle windows' changes (`add`ed)."""
    idle_rates = rates(idle)
    return {
        'redis_commands_per_s': round(sum(idle_rates.commands.values()), 1),
        'redis_commands_by_name_per_s': _rounded(idle_rates.commands, 2, 0.005),
        'redis_round_trips_per_s': round(sum(idle_rates.round_trips.values()), 1),
        'redis_round_trips_by_process_per_s': _rounded(idle_rates.round_trips, 2, 0.005),
        'redis_cpu_us_per_s': round(idle_rates.redis_cpu_s * 1e6, 1),
        'redis_command_us_per_s': round(idle_rates.redis_command_s * 1e6, 1),
        'pg_statements_per_s': round(idle_rates.pg_statements, 2),
        'pg_commits_per_s': round(idle_rates.pg_commits, 2),
        'cpu_ms_by_process_per_s': _rounded({name: s * 1000 for name, s in idle_rates.cpu_s.items()}, 2, 0.005),
        'seconds': round(idle.at, 1),
    }


def process_group(pid, pgid, leaders, client_pid):
    """The group a process's CPU and round trips count under: `client` for the benchmark's own process; a
    stack child's name for the processes of its group (`leaders`: {process group id: child name}), a lane
    worker's split into its main process (`<queue> consumer`: Celery's consumer, the broker's BRPOP and
    acks) and its pool processes (`<queue> pool`); `other` for anything else."""
    if pid == client_pid:
        return CLIENT
    name = leaders.get(pgid)
    if name is None:
        return 'other'
    if name.startswith('worker-'):
        queue = name[len('worker-'):]
        return f'{queue} consumer' if pid == pgid else f'{queue} pool'
    return name


def report(windows, calls, kinds_measured):
    """cost.json's figures from a run's windows (name -> its change) of `calls` calls each, for each of
    `kinds_measured` (the `coalesced` kind: its pairs less its leaders alone)."""
    idle = add(windows['idle_start'], windows['idle_end'])
    idle_rates = rates(idle)
    kinds = {}
    for kind in kinds_measured:
        if kind == 'coalesced':
            change = add(net(windows['coalesced_pairs'], idle_rates),
                         scaled(net(windows['coalesced_leaders'], idle_rates), -1))
        else:
            change = net(windows[kind], idle_rates)
        kinds[kind] = figures(change, calls)
    return {'kinds': kinds,
            'plain_celery': figures(net(windows['plain_celery'], idle_rates), calls),
            'durable_floor': figures(net(windows['durable_floor'], idle_rates), calls),
            'idle': idle_figures(idle)}
