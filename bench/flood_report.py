"""The flood benchmark's figures and targets from its samples: pure, no Django, no network (bench/flood.py).

A phase of the flood is a fixed time in one world (in-request or Heavy Lanes) with N bulk users; what it
gathered is a `Phase`: the latency of each trickle request (ms), the run time of each single-row call's own
work (ms), the bulk rows that came back within the phase, and the requests that failed or were refused.
`figure` makes the FIG the issue asks for from a loaded phase and its world's idle one; `targets` checks the
Heavy Lanes targets (docs/benchmarks.md) against both worlds' figures; `tally` counts, over rounds of both
worlds, how many rounds met each target.
"""
import math
from dataclasses import dataclass, field

TRICKLES = ('lexical', 'single', 'healthz')
FIG_KEYS = ('lexical_p99_ms', 'lexical_idle_p99_ms', 'single_p99_ms', 'single_run_p99_ms', 'healthz_p99_ms',
            'healthz_idle_p99_ms', 'bulk_rows_per_s', 'errors')
IDLE_TIMES = 1.5     # lexical and /healthz p99 under the flood, at most this times their idle p99
SINGLE_TIMES = 2     # single-row semantic p99 at most this times its run p99 ...
SINGLE_PLUS_MS = 100  # ... plus this
BULK_SHARE = 0.9     # bulk rows/s at least this share of the in-request world's best at any N
SLOWEST = 3          # the slowest requests of each trickle a phase's detail lists, with when they came


def percentile(values, q):
    """The nearest-rank q-th percentile (0 < q <= 100) of `values`; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def rounded(value, digits=1):
    return None if value is None else round(value, digits)


@dataclass
class Phase:
    """What one phase gathered. `latency_ms`: {trickle: [ms]}; `run_ms`: single-row calls' work, ms."""

    seconds: float
    latency_ms: dict = field(default_factory=lambda: {name: [] for name in TRICKLES})
    sent_at_s: dict = field(default_factory=lambda: {name: [] for name in TRICKLES})  # beside latency_ms: sent, s
    run_ms: list = field(default_factory=list)
    bulk_rows: int = 0
    errors: int = 0
    refusals: int = 0
    handles: int = 0  # 202s a waiting client got instead of its answer (it then polled for it)
    bulk_run_ms: list = field(default_factory=list)      # each bulk call's own work, ms
    bulk_latency_ms: list = field(default_factory=list)  # each bulk call, sent -> answered, ms

    def p99(self, trickle):
        return percentile(self.latency_ms[trickle], 99)

    def p50(self, trickle):
        return percentile(self.latency_ms[trickle], 50)

    def add(self, trickle, latency_ms, sent_at_s):
        """One trickle request that came back, `sent_at_s` seconds into the phase's measured part."""
        self.latency_ms[trickle].append(latency_ms)
        self.sent_at_s[trickle].append(sent_at_s)

    def slowest(self, trickle, count=SLOWEST):
        """[[ms, s into the phase]] of the `count` slowest requests of `trickle`, slowest first: with a
        request every TRICKLE_SECONDS a phase's p99 is its slowest one or two, and when they came is what
        to look for in the servers' logs."""
        pairs = sorted(zip(self.latency_ms[trickle], self.sent_at_s[trickle]), reverse=True)[:count]
        return [[rounded(ms), rounded(at)] for ms, at in pairs]


def figure(loaded, idle):
    """The FIG of a loaded phase beside its world's idle phase (keys FIG_KEYS, in that order)."""
    return {
        'lexical_p99_ms': rounded(loaded.p99('lexical')),
        'lexical_idle_p99_ms': rounded(idle.p99('lexical')),
        'single_p99_ms': rounded(loaded.p99('single')),
        'single_run_p99_ms': rounded(percentile(loaded.run_ms, 99)),
        'healthz_p99_ms': rounded(loaded.p99('healthz')),
        'healthz_idle_p99_ms': rounded(idle.p99('healthz')),
        'bulk_rows_per_s': rounded(loaded.bulk_rows / loaded.seconds if loaded.seconds > 0 else 0.0),
        'errors': loaded.errors,
    }


def detail(phase):
    """What a FIG leaves out: p50s, sample counts, the slowest requests, refusals and handles."""
    return {
        **{f'{name}_p50_ms': rounded(phase.p50(name)) for name in TRICKLES},
        **{f'{name}_n': len(phase.latency_ms[name]) for name in TRICKLES},
        'slowest': {name: phase.slowest(name) for name in TRICKLES},
        'single_runs_n': len(phase.run_ms), 'bulk_rows': phase.bulk_rows, 'refusals': phase.refusals,
        'bulk_run_p50_ms': rounded(percentile(phase.bulk_run_ms, 50)),
        'bulk_p50_ms': rounded(percentile(phase.bulk_latency_ms, 50)),
        'handles': phase.handles, 'seconds': phase.seconds,
    }


def ratio(value, bound):
    return None if value is None or not bound else round(value / bound, 2)


def targets(in_request, heavy_lanes, users):
    """{target: {'value', 'bound', 'met'}} of Heavy Lanes with `users` bulk users, against the FIGs of both
    worlds ({N: FIG}). A figure that is missing (no samples) doesn't meet its target."""
    fig = heavy_lanes[users]
    best = max((item['bulk_rows_per_s'] or 0.0) for item in in_request.values()) if in_request else 0.0
    checks = {}
    for name in ('lexical', 'healthz'):
        bound = None if fig[f'{name}_idle_p99_ms'] is None else IDLE_TIMES * fig[f'{name}_idle_p99_ms']
        checks[f'{name}_p99_vs_idle'] = (fig[f'{name}_p99_ms'], bound, 'le')
    run = fig['single_run_p99_ms']
    checks['single_p99_vs_run'] = (fig['single_p99_ms'], None if run is None else SINGLE_TIMES * run + SINGLE_PLUS_MS,
                                   'le')
    checks['bulk_rows_per_s_vs_in_request_best'] = (fig['bulk_rows_per_s'], BULK_SHARE * best, 'ge')
    checks['errors'] = (fig['errors'], 0, 'le')
    out = {}
    for name, (value, bound, sense) in checks.items():
        met = value is not None and bound is not None and (value <= bound if sense == 'le' else value >= bound)
        out[name] = {'value': value, 'bound': rounded(bound), 'met': met}
    return out


def tally(rounds):
    """{target: {'met', 'rounds', 'values', 'bounds'}} over `rounds`, each a `targets` result of one round of
    both worlds: how often each target held, and its value and bound in each round. On a shared machine one
    round's verdict is a draw from a wide spread (docs/benchmarks.md); the count is what to read."""
    out = {}
    for checks in rounds:
        for name, check in checks.items():
            line = out.setdefault(name, {'met': 0, 'rounds': 0, 'values': [], 'bounds': []})
            line['met'] += bool(check['met'])
            line['rounds'] += 1
            line['values'].append(check['value'])
            line['bounds'].append(check['bound'])
    return out
