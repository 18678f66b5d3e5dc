"""Each fault's real data judged again with one violation planted in it, so every run shows that its checks
can fail on what it saw: a second run of a real work on the other worker host halfway through the first
(with that host's death to excuse a second run, never an overlap), a lane given its limit more copies of a
real call outside the failover's window, and one real read of /readyz outside every span of its host's
own fault answering 503. A plant a check doesn't catch is a check that passes whatever happened; the
report says which were caught (docs/cluster.md), and the short run in CI requires all of them.
"""
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

from cluster import checks
from cluster.hosts import WORKER_HOSTS


@dataclass(frozen=True)
class Plant:
    check: str
    what: str
    caught: bool | None  # None: nothing in this fault's data to plant it in


def overlap(calls, runs, effect):
    """A second run of a real work on the other worker host, starting halfway through its run."""
    for call in calls.values():
        mine = runs.get(call.work_id) or []
        ended = [run for run in mine if run.seconds]
        if len(mine) != call.work.attempts or not ended:
            continue
        first = ended[-1]
        other = next(host for host in WORKER_HOSTS if host != first.host)
        second = checks.Run(first.work, call.work.attempts + 1, f'planted@{other} pid 1',
                            first.started + first.seconds / 2, first.seconds)
        planted_runs = {**runs, call.work_id: [*mine, second]}
        planted_calls = {pk: SimpleNamespace(work_id=c.work_id, work=SimpleNamespace(
            attempts=c.work.attempts + (1 if c.work_id == call.work_id else 0))) for pk, c in calls.items()}
        killed = {**effect.killed, first.host: first.started}  # its node "died": a second run, not an overlap
        check = checks.runs_once(planted_calls, planted_runs, killed, effect.cut_off)
        return Plant(check.name, f'run {second.attempt} of {call.work_id} on {other} halfway through run '
                                 f'{first.attempt}', not check.passed)
    return Plant('no work runs twice at once', 'an overlap', None)


def over(calls, effect):
    """Its lane's limit more copies of a real counted call admitted outside the failover's window (and one
    more for each work taken over in it, which the check lets be one over)."""
    taken = checks.taken_over_by_lane(calls)
    for call in calls.values():
        admission = call.admission or {}
        lanes = [lane for lane in admission.get('lanes') or () if lane[0] != 'api_heavy_task']
        if (admission.get('decision') != 'admitted' or not admission.get('holding') or not lanes
                or call.work.attempts > 1 or not call.work.finished_at
                or checks.within(call.created_at.timestamp(), effect.failover)
                or call.work.finished_at - call.created_at < timedelta(seconds=1)):
            continue
        copies = {f'{call.pk}-planted-{n}': SimpleNamespace(
            pk=f'{call.pk}-planted-{n}', work_id=f'{call.work_id}-planted-{n}', work=call.work,
            created_at=call.created_at, admission=admission) for n in range(max(
                int(limit) + taken.get(key, 0) for _lane, key, limit, _count in lanes))}
        check = checks.lanes_within_limits({**calls, **copies}, effect.failover, effect.clock_ahead)
        return Plant(check.name, f'{len(copies)} more calls beside {call.pk} in {lanes[0][0]}', not check.passed)
    return Plant('no lane over its limit outside the failover window', 'a lane over', None)


def unready(reads, final, effect):
    """One real read of /readyz, outside every span of its host's own fault, answering 503 instead."""
    for index, (host, status, sent, answered) in enumerate(reads):
        if status != 200 or any(h == host and sent <= end and start <= answered for h, start, end in effect.unready):
            continue
        planted = [*reads[:index], (host, '503 planted', sent, answered), *reads[index + 1:]]
        check = checks.readiness(planted, final, effect.unready, effect.down)
        return Plant(check.name, f'{host} 503 at {sent % 1000:.1f}', not check.passed)
    return Plant("each host's /readyz tells the truth", 'a 503', None)


def plant(calls, runs, effect, reads, final):
    return [overlap(calls, runs, effect), over(calls, effect), unready(reads, final, effect)]

