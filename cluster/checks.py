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


def run_spans(lines):
    """{work id: [(start, end)]} of every run a worker finished, from Celery's own line for it ("Task
    heavy_lanes.run_heavy_call[<id>] succeeded in 1.26s", written when the run ended): a run its node's death
    cut short has none, and wasn't running afterwards."""
    spans = {}
    for record in lines:
        data = record.get('data') or {}
        if record.get('logger') != 'celery.app.trace' or data.get('runtime') is None or not data.get('id'):
            continue
        end = datetime.fromisoformat(record['time'].replace('Z', '+00:00')).timestamp()
        spans.setdefault(data['id'], []).append((end - float(data['runtime']), end))
    return spans


def runs_once(calls, lines, node_died):
    """No work ran twice at once (two deliveries' Celery spans overlap); a work ran twice at all only when the
    cluster took its node for dead (killed, or cut off longer than a lease): those are counted."""
    works = {call.work_id: call.work for call in calls.values()}
    twice = [pk for pk, work in works.items() if work.attempts > 1]
    at_once = []
    for pk, spans in run_spans(lines).items():
        if pk in works and works[pk].attempts > 1:  # a delivery that found it running elsewhere ran nothing
            spans.sort()
            at_once += [pk for (_s1, e1), (s2, _e2) in zip(spans, spans[1:]) if s2 < e1 - 0.05]
    passed = node_died or not (twice or at_once)
    return Check('no work runs twice at once; twice only after a node died', passed,
                 f'{len(works)} works, {len(twice)} started twice {twice[:3]}, {len(at_once)} delivered again while '
                 f'the first delivery was still in its task {at_once[:3]} (a node died or was cut off: {node_died})')


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


def over_limit(calls, slack_seconds=0.5, clock_ahead=None):
    """Calls admitted into a lane that already held their limit of other counted, open calls, from the rows:
    each call holds its lanes from its row's creation to its work's end less `slack_seconds` (inside the span
    it truly held them), and is compared with its own limit (a single-row call may use the reserve a bulk
    call may not). {lane key: (calls open at once, the limit of the call admitted over it)}."""
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
            holding = sum(1 for s, e, _ in items if s <= start < e)
            if holding > limit and holding - limit >= excess.get(key, (0, 0))[0] - excess.get(key, (0, 0))[1]:
                excess[key] = (holding, limit)
    return excess


def taken_over_by_lane(calls):
    """{lane key: works in that lane taken over from a dead node} — a work taken over holds every one of its
    lanes, so each lane it is in may be one over for it."""
    counts = {}
    for call in {c.work_id: c for c in calls.values()}.values():
        if call.work.attempts > 1:
            for _lane, key, _limit, _count in (call.admission or {}).get('lanes') or ():
                counts[key] = counts.get(key, 0) + 1
    return counts


def lanes_within_limits(calls, fail_open, clock_ahead=None):
    """No lane over its limit, but in two documented windows (docs/operations.md, "A worker node is lost"):
    a Redis failover (the lanes fail open) and a work taken over from a dead node, which is counted whatever
    its lanes hold, so a lane whose expired lease went to a new call holds one over until one of them ends —
    at most one over, in each lane, per work in that lane taken over."""
    excess = over_limit(calls, clock_ahead=clock_ahead)
    taken_over = taken_over_by_lane(calls)
    beyond = {key: (worst, limit) for key, (worst, limit) in excess.items()
              if worst - limit > taken_over.get(key, 0)}
    passed = not excess or fail_open or not beyond
    detail = 'none over' if not excess else ', '.join(
        f'{key.rsplit(":", 1)[-1]} {worst} of {limit}' for key, (worst, limit) in excess.items())
    if excess and fail_open:
        detail += ' during the documented fail-open window of a Redis failover'
    elif excess and not beyond:
        detail += ' while works taken over from a dead node were counted over their lanes (documented): ' + \
            ', '.join(f'{key.rsplit(":", 1)[-1]} {taken_over.get(key, 0)}' for key in excess)
    return Check('no lane over its limit outside the documented windows', passed, detail)


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


def readiness(during, after, truthful):
    """Every read of each API host's /readyz during the fault and after it told the truth (`truthful`)."""
    wrong = [(host, status, round(when % 1000, 1)) for host, status, when in during
             if not truthful(host, status, when)]
    wrong += [(host, status, 'after') for host, status, when in after if not truthful(host, status, when, True)]
    statuses = sorted({str(status) for _h, status, _w in during + after})
    return Check("each host's /readyz tells the truth", not wrong,
                 f'{len(during) + len(after)} reads ({", ".join(statuses)})'
                 + (f', wrong: {wrong[:4]}' if wrong else ', all true'))


def planned_restart_loses_no_request(submissions):
    """A planned restart (gunicorn's graceful stop, a warm shutdown) fails no request: no 502 or 504 from the
    proxy, no connection reset."""
    lost = [s.status or s.error for s in submissions if s.status in (502, 504) or s.error]
    return Check('a planned restart fails no request', not lost,
                 f'{len(submissions)} requests, {len(lost)} failed {sorted(set(map(str, lost)))}')
