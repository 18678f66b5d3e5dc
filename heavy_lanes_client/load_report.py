"""The load generator's report: the calls grouped by tier and by kind (counts by outcome, latency
percentiles), the largest in-flight counts per lane and queue, and the text printed at the end.

Latency runs from a call's first send to its task's final state, for succeeded calls only; percentiles
are nearest-rank. `LoadReport.ok` is False when any call is unaccounted.
"""
import math
from collections import Counter
from dataclasses import dataclass

from heavy_lanes_client.ledger import Outcome
from heavy_lanes_client.load_plan import KINDS, TIERS
from heavy_lanes_client.summary import table


@dataclass(frozen=True)
class GroupStats:
    """Counts and latency percentiles (seconds, succeeded calls) of the calls of one tier or kind."""

    name: str
    calls: int
    admitted: int
    shadow_refused: int
    outcomes: tuple  # ((outcome, count), ...) over Outcome.ALL, then ('unaccounted', n)
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    def count(self, outcome):
        return dict(self.outcomes).get(outcome, 0)


@dataclass(frozen=True)
class LaneMax:
    lane: str
    max_in_flight: int
    limit: int | None


@dataclass(frozen=True)
class LoadReport:
    url: str
    users: int
    seconds: float
    wall_seconds: float
    calls: tuple          # CallResult, in the order they were started
    by_tier: tuple        # GroupStats
    by_kind: tuple        # GroupStats
    server_lanes: tuple   # LaneMax from /capacity/status/ samples (empty without a staff token)
    client_lanes: tuple   # LaneMax of the users' own open tasks per queue (exact)
    queue_depths: tuple   # LaneMax of each queue's depth seen in the samples
    samples: int
    sample_errors: int
    sample_note: str | None
    interrupted: bool

    @property
    def unaccounted(self):
        return sum(1 for call in self.calls if call.outcome is None)

    @property
    def ok(self):
        return self.unaccounted == 0


def percentile(values, fraction):
    """Nearest-rank percentile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]


def _group(name, calls):
    outcomes = Counter(call.outcome for call in calls)
    latencies = [call.latency for call in calls
                 if call.outcome == Outcome.SUCCEEDED and call.latency is not None]
    return GroupStats(
        name=name, calls=len(calls), admitted=sum(1 for call in calls if call.admitted),
        shadow_refused=sum(1 for call in calls if call.decision == 'shadow-refused'),
        outcomes=tuple((outcome, outcomes.get(outcome, 0)) for outcome in Outcome.ALL)
        + (('unaccounted', outcomes.get(None, 0)),),
        p50=percentile(latencies, 0.5), p90=percentile(latencies, 0.9), p99=percentile(latencies, 0.99),
        max=max(latencies) if latencies else None)


def by_tier(calls):
    """The GroupStats of each tier the calls have, in TIERS order, then of them all."""
    tiers = sorted({call.tier for call in calls}, key=lambda tier: TIERS.index(tier))
    return tuple(_group(tier, [call for call in calls if call.tier == tier]) for tier in tiers) + (
        _group('all', list(calls)),)


def by_kind(calls):
    """The GroupStats of each kind of call made, in KINDS order."""
    kinds = [kind for kind in KINDS if any(call.kind == kind for call in calls)]
    return tuple(_group(kind, [call for call in calls if call.kind == kind]) for kind in kinds)


def _seconds(value):
    return '-' if value is None else f'{value:.2f}'


def _group_rows(groups):
    rows = []
    for group in groups:
        counts = [group.count(outcome) for outcome in (
            Outcome.REFUSED, Outcome.RATE_LIMITED, Outcome.SUCCEEDED, Outcome.FAILED, Outcome.EXPIRED,
            Outcome.CANCELLED, Outcome.ERROR, 'unaccounted')]
        times = [_seconds(value) for value in (group.p50, group.p90, group.p99, group.max)]
        rows.append([group.name, group.calls, group.admitted, group.shadow_refused, *counts, *times])
    return rows


HEADERS = ['', 'calls', 'admitted', 'shadow-ref', 'refused', 'rate-ltd', 'completed', 'failed', 'expired',
           'cancelled', 'errors', 'lost', 'p50 s', 'p90 s', 'p99 s', 'max s']


def format_load_report(report):
    interrupted = ' - interrupted' if report.interrupted else ''
    lines = [(f'Load: {report.users} users for {report.seconds:g} s against {report.url} '
              f'(wall {report.wall_seconds:.1f} s){interrupted}'), '']
    lines.append(table(_group_rows(report.by_tier), ['tier', *HEADERS[1:]]))
    lines.append('')
    if report.by_kind:
        lines.append(table(_group_rows(report.by_kind), ['kind', *HEADERS[1:]]))
        lines.append('')
    lines.append('Latency: first send to final state, completed (succeeded) calls. "completed" = succeeded; '
                 '"lost" = unaccounted.')
    if report.server_lanes:
        lanes = ', '.join(f'{lane.lane} {lane.max_in_flight}'
                          + (f'/{lane.limit}' if lane.limit is not None else '')
                          for lane in report.server_lanes)
        lines.append(f'Largest in flight per lane (server, {report.samples} samples): {lanes}')
    if report.queue_depths:
        depths = ', '.join(f'{queue.lane} {queue.max_in_flight}' for queue in report.queue_depths)
        lines.append(f'Largest queue depth: {depths}')
    if report.sample_note:
        lines.append(f'Sampling: {report.sample_note}')
    if report.client_lanes:
        lanes = ', '.join(f'{lane.lane} {lane.max_in_flight}' for lane in report.client_lanes)
        lines.append(f'Largest in flight per queue (these users\' open tasks): {lanes}')
    outcomes = Counter(call.outcome for call in report.calls)
    parts = ' + '.join(f'{outcomes.get(outcome, 0)} {outcome.replace("_", " ")}' for outcome in Outcome.ALL)
    verdict = 'none lost' if report.ok else f'{report.unaccounted} UNACCOUNTED'
    lines.append(f'Accounting: {len(report.calls)} calls = {parts}; {verdict}')
    for call in report.calls:
        if call.outcome is None:
            task = call.task_id or '-'
            lines.append(f'  unaccounted: call {call.number} ({call.tier}, {call.kind}, task {task})')
    return '\n'.join(lines)
