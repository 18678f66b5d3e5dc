"""docs/cluster.md: the run's faults × checks, PASS or FAIL with what was seen, and its figures."""
import json

HEAD = """# The cluster run

The production shape on one machine (cluster/, `make cluster`): each host a network namespace on one bridge —
a database host (its own PostgreSQL), a Redis primary and a replica with three Sentinels on three hosts, two
API hosts running gunicorn as docker-compose.yml does (production settings, Redis through the Sentinels),
nginx round robin on a proxy host, two worker hosts each running a node for every lane queue, beat, the
maintenance worker and Flower on an ops host, and the load generator on a client host (waiting and polling
clients, single-row and bulk semantic `$match` calls, one polled call in seven cancelled), through the proxy.
Each fault is injected under that load; after it the load stops and the checks run.

Settings that differ from production's defaults, so a fault plays out within a minute: `lease_seconds` 15,
`renew_seconds` 5, `WORKERS_SWEEP_SECONDS` 5, `WORKERS_SWEEP_GRACE_SECONDS` 10, `WORKERS_RECONCILE_SECONDS` 2,
`CAPACITY_CONFIG_CACHE_SECONDS` 2; mode `enforce` for everyone; the `tfidf-svd` embedder and `fuzzy` reranker
(the sentence model would need a core per process); Sentinel `down-after-milliseconds` 2000.
"""


def write(path, outcomes, seconds, command, started, figures=None):
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
                  f'{outcome.figures.get("async submission max s")} s.', '']
        lines += [f'- {"PASS" if c.passed else "**FAIL**"} {c.name}: {c.detail}' for c in outcome.checks]
        lines.append('')
    with open(path, 'w') as handle:
        handle.write('\n'.join(lines))
