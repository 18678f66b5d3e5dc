"""The checks made after each fault, each a `Check` (name, passed, detail) for the report. They read what a
user and an operator can read: the calls' rows, the lanes in Redis (through the Sentinels), the worker
nodes' `ocl_capacity` lines, `/capacity/status/` and every API host's `/readyz`."""
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

FINAL = ('succeeded', 'failed', 'cancelled', 'expired')


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


def calls_of(submissions):
    """{call id: Call with its work} of the submissions' handles; a connection the database ended (its
    restart) is dropped and the read made again on a new one."""
    from django.db import OperationalError, connection

    from workers.models import Call
    ids = [s.call_id for s in submissions]
    for attempt in range(30):
        try:
            return {call.pk: call for call in Call.objects.filter(pk__in=ids).select_related('work')}
        except OperationalError:
            connection.close()
            if attempt == 29:
                raise
            time.sleep(1)


def wait_final(submissions, timeout):
    """Wait until every handle's call ended; the check and the time the last one ended."""
    deadline = time.monotonic() + timeout
    while True:
        calls = calls_of(submissions)
        missing = [s.call_id for s in submissions if s.call_id not in calls]
        open_ = [pk for pk, call in calls.items() if call.work.state not in FINAL]
        if not open_ or time.monotonic() > deadline:
            break
        time.sleep(1)
    states = {}
    for call in calls.values():
        states[call.work.state] = states.get(call.work.state, 0) + 1
    passed = not missing and not open_
    detail = f'{len(submissions)} handles: {json.dumps(states, sort_keys=True)}'
    if missing:
        detail += f'; {len(missing)} without a row: {missing[:3]}'
    if open_:
        detail += f'; {len(open_)} still open after {timeout} s: {open_[:3]}'
    return Check('every handle reaches a final state', passed, detail), calls


def cancelled_only_when_asked(submissions, calls):
    asked = {s.call_id for s in submissions if s.cancelled}
    wrong = [pk for pk, call in calls.items() if call.work.state == 'cancelled' and call.cancelled_at is None
             and pk not in asked]
    return Check('cancelled only when a client cancelled', not wrong,
                 f'{sum(1 for c in calls.values() if c.work.state == "cancelled")} cancelled, '
                 f'{len(wrong)} nobody cancelled {wrong[:3]}')


@dataclass(frozen=True)
class Run:
    """One run of a work, from its worker's two lines (workers.execution.RunLine): its claim's time by the
    database's clock (epoch seconds) and, once it ended, the seconds it ran by its host's monotonic clock."""

    work: str
    attempt: int
    worker: str  # '<queue>@<host> pid <pid>'
    started: float
    seconds: float | None = None  # None: no end line (its process died, or it never stopped)

    @property
    def host(self):
        return self.worker.partition('@')[2].partition(' ')[0]


def runs_of(records):
    """{work id: [Run], by start} from the worker hosts' JSON log records: each run's start line, with the
    seconds of its end line when it wrote one."""
    found = {}
    for record in records:
        run = record.get('run')
        if record.get('logger') != 'heavy_lanes' or not isinstance(run, dict) or not run.get('started'):
            continue
        key = (run['work'], run['attempt'], run['worker'])
        started = datetime.fromisoformat(run['started'].replace('Z', '+00:00')).timestamp()
        seen = found.get(key)
        seconds = run.get('seconds', seen.seconds if seen else None)
        found[key] = Run(run['work'], int(run['attempt']), run['worker'], started, seconds)
    runs = {}
    for run in sorted(found.values(), key=lambda run: (run.started, run.attempt)):
        runs.setdefault(run.work, []).append(run)
    return runs


def runs_once(calls, runs, killed=None, cut_off=None):
    """No work ran twice at once, judged by its runs' own times (`runs`: runs_of): a run spans its claim to
    the end of its computation, or — with no end line — to its host's kill (`killed`: {host: time.time()}),
    or forever (it never stopped), so a run a death cut short is judged too. And a work ran again only when
    the node of its run before was killed or cut off (`cut_off`: {host: time.time()}) after that run began;
    every run its row counts (`attempts`) has its lines."""
    killed, cut_off = killed or {}, cut_off or {}
    works = {call.work_id: call.work for call in calls.values()}
    at_once, again, unaccounted, unended = [], [], [], []
    for pk, work in works.items():
        mine = runs.get(pk, [])
        if len(mine) != work.attempts:
            unaccounted.append(f'{pk} ({len(mine)} of {work.attempts} runs)')
        spans = []
        for run in mine:
            if run.seconds is not None:
                end = run.started + run.seconds
            elif run.host in killed and run.started <= killed[run.host]:
                end = killed[run.host]
            else:
                end = float('inf')
                unended.append(f'{pk} run {run.attempt} on {run.host}')
            spans.append((run, end))
        for (first, first_end), (then, _end) in zip(spans, spans[1:]):
            if then.started < first_end:
                at_once.append(f'{pk} runs {first.attempt} and {then.attempt} ({first.host}, {then.host})')
            lost = killed.get(first.host, cut_off.get(first.host))
            if lost is None or lost < first.started:
                again.append(f'{pk} run {then.attempt} after run {first.attempt} on {first.host}, which lived')
    ran = sum(len(runs.get(pk, [])) for pk in works)
    passed = not (at_once or again or unaccounted or unended)
    detail = (f'{len(works)} works, {ran} runs, {sum(1 for w in works.values() if w.attempts > 1)} started twice; '
              f'{len(at_once)} at once {at_once[:3]}; {len(again)} again while the node of the run before lived '
              f'{again[:3]}; {len(unended)} never ended on a node that lived {unended[:3]}; {len(unaccounted)} '
              f'with runs their lines miss {unaccounted[:3]} (killed: {sorted(killed) or "none"}, cut off: '
              f'{sorted(cut_off) or "none"})')
    return Check('no work runs twice at once; again only after its node died', passed, detail)


def lane_in_flight(lanes, prefix):
    """{lane key: unexpired leases} of every lease lane (rate windows excluded)."""
    seconds, micros = lanes.time()
    now_ms = seconds * 1000 + micros // 1000
    found = {}
    for key in lanes.scan_iter(match='{' + prefix + '}:*', count=1000):
        name = key.decode()
        if ':rate:' in name or lanes.type(key) != b'zset':
            continue
        count = lanes.zcount(key, f'({now_ms}', '+inf')
        if count:
            found[name] = count
    return found


def leases_back(lanes, prefix, last_end, bound_seconds, timeout):
    """Every lease back within `bound_seconds` (lease_seconds + one renewal) of the last call's end."""
    deadline = time.monotonic() + timeout
    while True:
        held = lane_in_flight(lanes, prefix)
        if not held or time.monotonic() > deadline:
            break
        time.sleep(1)
    back_after = time.time() - last_end
    passed = not held and back_after <= bound_seconds + 5
    return Check('every lease back within lease_seconds + one renewal', passed,
                 f'{"none held" if not held else held} {back_after:.0f} s after the last call ended '
                 f'(bound {bound_seconds} s)')


def within(when, window):
    """Whether `when` (epoch seconds) falls in `window` ((from, to) epoch seconds, or None)."""
    return bool(window) and window[0] <= when <= window[1]


def over_limit(calls, slack_seconds=0.5, clock_ahead=None, window=None):
    """Calls admitted into a lane that already held their limit of other counted, open calls, from the rows,
    but for those admitted inside `window` (the failover's measured window, epoch seconds): each call holds
    its lanes from its row's creation to its work's end less `slack_seconds` (inside the span it truly held
    them), and is compared with its own limit (a single-row call may use the reserve a bulk call may not).
    {lane key: (calls open at once, the limit of the call admitted over it)}, the worst of each lane."""
    spans = {}  # lane key -> {work id: (start, end, limit)}
    for call in calls.values():
        admission = call.admission or {}
        if admission.get('decision') != 'admitted' or not admission.get('holding') or not call.work.finished_at:
            continue
        ahead = next((seconds for host, seconds in (clock_ahead or {}).items()
                      if f'@{host} ' in call.work.worker + ' '), 0)
        end = call.work.finished_at - timedelta(seconds=slack_seconds + ahead)
        for lane, key, limit, _count in admission.get('lanes') or ():
            if lane != 'api_heavy_task' and end > call.created_at:
                spans.setdefault(key, {}).setdefault(call.work_id, (call.created_at, end, int(limit)))
    excess = {}
    for key, works in spans.items():
        items = list(works.values())
        for start, _end, limit in items:
            if within(start.timestamp(), window):
                continue
            holding = sum(1 for s, e, _ in items if s <= start < e)
            if holding > limit and holding - limit >= excess.get(key, (0, 0))[0] - excess.get(key, (0, 0))[1]:
                excess[key] = (holding, limit)
    return excess


def uncounted(calls, window=None):
    """Calls the limiter let through uncounted (`unavailable`: it failed open) outside `window`."""
    return sorted({call.pk for call in calls.values()
                   if (call.admission or {}).get('decision') == 'unavailable'
                   and not within(call.created_at.timestamp(), window)})


def taken_over_by_lane(calls):
    """{lane key: works in that lane taken over from a dead node} — a work taken over holds every one of its
    lanes, so each lane it is in may be one over for it."""
    counts = {}
    for call in {c.work_id: c for c in calls.values()}.values():
        if call.work.attempts > 1:
            for _lane, key, _limit, _count in (call.admission or {}).get('lanes') or ():
                counts[key] = counts.get(key, 0) + 1
    return counts


def lanes_within_limits(calls, window=None, clock_ahead=None):
    """No lane over its limit and no call let through uncounted, judged over the whole fault but for the
    Redis failover's measured window (`window`: (from, to) epoch seconds, from the old primary's loss to the
    API hosts' reconnection; docs/deployment.md: the lanes fail open then). And in one documented case
    (docs/operations.md, "A worker node is lost"): a work taken over from a dead node is counted whatever its
    lanes hold, so a lane whose expired lease went to a new call holds one over until one of them ends — at
    most one over, in each lane, per work in that lane taken over."""
    excess = over_limit(calls, clock_ahead=clock_ahead, window=window)
    taken_over = taken_over_by_lane(calls)
    beyond = {key: (worst, limit) for key, (worst, limit) in excess.items()
              if worst - limit > taken_over.get(key, 0)}
    through = uncounted(calls, window)
    passed = not beyond and not through
    detail = 'none over' if not excess else ', '.join(
        f'{key.rsplit(":", 1)[-1]} {worst} of {limit}' for key, (worst, limit) in excess.items())
    if excess and not beyond:
        detail += ' while works taken over from a dead node were counted over their lanes (documented): ' + \
            ', '.join(f'{key.rsplit(":", 1)[-1]} {taken_over.get(key, 0)}' for key in excess)
    detail += f'; {len(through)} let through uncounted {through[:3]}'
    if window:
        inside = sum(1 for call in calls.values() if within(call.created_at.timestamp(), window))
        detail += (f'; judged outside the failover window ({window[1] - window[0]:.1f} s from the old primary '
                   f'lost to every API host reconnected; calls made in it: {inside})')
    return Check('no lane over its limit outside the failover window', passed, detail)


def pools_sum(status_of, timeout=40):
    """Across the live nodes, each queue's pool adds up to its configured size."""
    deadline = time.monotonic() + timeout
    while True:
        status = status_of()
        queues = (status or {}).get('queues') or {}
        wrong = {name: (q.get('pool'), q.get('configured_pool')) for name, q in queues.items()
                 if name != 'maintenance' and q.get('pool') != q.get('configured_pool')}
        if queues and not wrong or time.monotonic() > deadline:
            break
        time.sleep(1)
    return Check('the pools across nodes sum to each lane\'s size', bool(queues) and not wrong,
                 'each queue at its size' if queues and not wrong else f'pool/configured: {wrong or status}')


def latency(submissions, bound):
    took = sorted(s.took for s in submissions if s.kind == 'polling' and s.status)
    if not took:
        return Check('submission latency within the bound', False, 'no polling submissions answered')
    worst = took[-1]
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
    return Check('submission latency within the bound', worst <= bound,
                 f'{len(took)} async submissions: p99 {p99:.2f} s, max {worst:.2f} s (bound {bound} s)')


def readiness(reads, final, unready=(), down=()):
    """Every read of each API host's /readyz through the fault and the load after it, and once at the end,
    told the truth. A read is (host, status, sent, answered), epoch seconds. `unready`: (host, from, to)
    spans in which that host may answer anything (the fault took it, its database or its Redis away, until
    the harness saw it ready again); `down`: spans in which it must not answer 200 (its process killed or
    cut off, its database stopped). A read judged in a span lies wholly inside it; every other read, and
    every read at the end, must be 200: a fault of another host, of a worker host, or of nothing of its
    own never takes a host out."""
    def inside(host, sent, answered, spans):
        return any(h == host and start <= sent and answered <= end for h, start, end in spans)

    def touches(host, sent, answered, spans):
        return any(h == host and sent <= end and start <= answered for h, start, end in spans)

    wrong = []
    for host, status, sent, answered in reads:
        if inside(host, sent, answered, down):
            if status == 200:
                wrong.append((host, status, 'down', round(sent % 1000, 1)))
        elif not touches(host, sent, answered, unready) and status != 200:
            wrong.append((host, status, round(sent % 1000, 1)))
    wrong += [(host, status, 'at the end') for host, status, _sent, _answered in final if status != 200]
    statuses = sorted({str(status) for _h, status, _s, _a in reads + final})
    free = ', '.join(f'{host} {end - start:.0f} s' for host, start, end in unready) or 'none'
    return Check("each host's /readyz tells the truth", not wrong,
                 f'{len(reads) + len(final)} reads ({", ".join(statuses)}; a host out of its own fault: {free})'
                 + (f', wrong: {wrong[:4]}' if wrong else ', all true'))


def planned_restart_loses_no_request(submissions):
    """A planned restart (gunicorn's graceful stop, a warm shutdown) fails no request: no 502 or 504 from the
    proxy, no connection reset."""
    lost = [s.status or s.error for s in submissions if s.status in (502, 504) or s.error]
    return Check('a planned restart fails no request', not lost,
                 f'{len(submissions)} requests, {len(lost)} failed {sorted(set(map(str, lost)))}')
