"""docs/cluster.md: the run's faults × checks, PASS or FAIL with what was seen, and its figures."""
import json

HEAD = """# The cluster run

The production shape on one machine (cluster/, `make cluster`): each host a network namespace on one bridge —
a database host (its own PostgreSQL), a Redis primary and a replica with three Sentinels on three hosts, two
API hosts running gunicorn as docker-compose.yml does (production settings, Redis through the Sentinels),
nginx round robin on a proxy host, two worker hosts each running a node for every lane queue, beat, the
maintenance worker and Flower on an ops host, and the load generator on a client host (waiting and polling
clients, single-row and bulk semantic `$match` calls, one polled call in seven cancelled), through the proxy.
Each fault is injected after 10 s of that load, the load runs on 15 s after the host is back, then stops;
then the checks run (cluster/checks.py; tests/cluster/test_checks.py plants in each the fault it exists to
catch and sees it fail):

- **final**: every call a client got a handle for (a 202's `Location`, a 200's `Content-Location`) reaches
  a final state within 2 minutes; **cancelled** only those a client cancelled;
- **runs once**: no work ran twice at once, judged by its runs' own times: each run's worker writes a line
  when it claims the work (the row's `started_at`, by the database's clock) and one when its computation
  stops (the seconds it ran, by its host's monotonic clock: workers.execution.RunLine); a run with no end
  line ran until its host was killed, or forever when its host lived. A work ran again only when the node of
  its run before was killed or cut off after that run began, and every run its row counts (`attempts`) has
  its lines — a node's death excuses a second run, never an overlap;
- **leases**: no lease left in any lane, `lease_seconds` + one renewal after the last call ended;
- **lanes**: from the rows, over the whole fault, no call admitted into a lane that already held its limit
  of counted open calls, and no call let through uncounted (`unavailable`), except inside a Redis
  failover's window as the harness measures it (from the old primary's kill, or the failover asked of a
  Sentinel, until the Sentinels named the new primary and every API host's `/readyz` answered 200 again,
  plus the breaker's 0.5 s probe); and a work taken over from a dead node counted over each of its lanes
  (documented: in each lane, one over per such work in it);
- **pools**: each queue's pool processes across the live nodes add up to its configured size
  (`/capacity/status/`);
- **latency** (failovers): every `respond-async` submission answered within 10 s (the limiter's and the
  publish deadline plus the Sentinels' detection);
- **planned restarts** (rolling restart, drain, the clock change's restarts): no request failed (no 502/504
  from nginx, no reset);
- **/readyz**: each API host's, read every second through the fault and the load after it, and once at the
  end: 200 at every read but while the fault took that host, its database or its Redis away (its own kill,
  cut or restart, until the harness saw it ready again; the database's restart; the failover's window),
  and not 200 while its process is killed or cut off or the database is stopped; a read is judged inside
  such a span only when it began and ended there. A worker host's fault never takes an API host out, nor
  does one API host's fault the other.

Settings that differ from production's defaults, so a fault plays out within a minute: `lease_seconds` 15,
`renew_seconds` 5, `WORKERS_SWEEP_SECONDS` 5, `WORKERS_SWEEP_GRACE_SECONDS` 10, `WORKERS_RECONCILE_SECONDS` 2,
`CAPACITY_CONFIG_CACHE_SECONDS` 2; mode `enforce` for everyone; the `tfidf-svd` embedder and `fuzzy` reranker
(the sentence model would need a core per process); Sentinel `down-after-milliseconds` 2000.

The clock fault runs worker2's nodes with libfaketime preloaded (`FAKETIME=+30s`, the wall clock only) and
their Python sleeping through `select` (cluster/skewed/sitecustomize.py): that libfaketime fails Python's
`time.sleep`, and the `faketime` command forks and drops the SIGTERM of a warm stop. The service times
every liveness it compares across hosts by one clock: a work's claim and heartbeats by the database's, a
lane node's heartbeat and published pool and every lease by Redis's.
"""


def write(path, outcomes, seconds, command, started, figures=None):
    figures = dict(figures or {})
    floor = figures.pop('floor', None) or {}
    names = []
    for outcome in outcomes:
        for check in outcome.checks:
            if check.name not in names:
                names.append(check.name)
    lines = [HEAD, f'Run: `{command}`, {started}, {seconds:.0f} s in all '
                   f'({sum(o.passed for o in outcomes)} of {len(outcomes)} faults passed every check).', '',
             *(['## What a call costs Redis', '',
                'Before the faults: 10 s idle, then 20 s of the load, on the primary (INFO stats and cpu; the idle '
                'rate subtracted), per call that ran (cluster/measure.py): '
                + ', '.join(f'{key} {value}' for key, value in figures.items()) + '.', ''] if figures else []),
             '## Faults × checks', '',
             '| fault | ' + ' | '.join(f'{i + 1}' for i in range(len(names))) + ' |',
             '|---|' + '---|' * len(names)]
    for outcome in outcomes:
        marks = {check.name: 'PASS' if check.passed else '**FAIL**' for check in outcome.checks}
        lines.append(f'| {outcome.fault} | ' + ' | '.join(marks.get(name, '–') for name in names) + ' |')
    lines += ['', 'Checks: ' + '; '.join(f'{i + 1}. {name}' for i, name in enumerate(names)) + '.', '',
              '## What each check saw', '']
    for outcome in outcomes:
        lines += [f'### {outcome.fault} ({outcome.seconds:.0f} s)', '',
                  f'Submissions by answer: `{json.dumps(outcome.figures.get("submissions", {}), sort_keys=True)}`; '
                  f'{outcome.figures.get("handles", 0)} handles; {outcome.figures.get("started twice", 0)} works '
                  f'started twice; the slowest `respond-async` submission took '
                  f'{outcome.figures.get("async submission max s")} s'
                  + (f'; the failover\'s window, measured: {outcome.figures["failover window s"]} s'
                     if outcome.figures.get('failover window s') is not None else '') + '.', '']
        lines += [f'- {"PASS" if c.passed else "**FAIL**"} {c.name}: {c.detail}' for c in outcome.checks]
        if outcome.planted:
            lines += ['', 'The same data with one violation planted (cluster/planted.py): ' + '; '.join(
                f'{p.check}: {p.what}, ' + {True: 'caught', False: '**missed**', None: 'nothing to plant it in'}[
                    p.caught] for p in outcome.planted) + '.']
        lines.append('')
    if floor:
        lost = {o.fault: next((c for c in o.checks if c.name.startswith('every handle')), None) for o in outcomes}
        lines += ['## Plain Celery beside it', '',
                  'The same faults against a client of the `delay()` floor view (api/bench_views.py: `apply_async()` '
                  'on the lane queue and a 202 with the task id, no row, lease or sweep), run after the faults above '
                  'on the same cluster (cluster/floor.py). A call vanished when no result was stored a minute '
                  'after its load stopped.', '',
                  '| fault | plain Celery: published | vanished | refused or failed | Heavy Lanes: handles lost |',
                  '|---|---|---|---|---|']
        for name, (published, gone, refused) in floor.items():
            check = lost.get(name)
            heavy = ('0' if check.passed else check.detail) if check else '–'
            lines.append(f'| {name} | {published} | {gone} | {refused} | {heavy} |')
        lines.append('')
    with open(path, 'w') as handle:
        handle.write('\n'.join(lines))
