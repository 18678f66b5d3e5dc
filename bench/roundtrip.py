"""Round trip: a minimal heavy call (semantic `$match`, one row) from submit to result, against a bare view on
the same server that runs `apply_async().get()` of a task doing the same domain work on the same broker and
workers (/bench/roundtrip/, api/bench_views.py).

    .venv/bin/python bench/roundtrip.py [--calls 60] [--api-workers 3] [--terminology hpo]
                                        [--plot docs/img/roundtrip.png] [--projection-fix] [--db-reuse]

A private stack (bench/stack.py) with one `interactive` lane worker (pool 1: a one-row call's lane), mode
enforce for every client (enforce_for=all) with the default limits: one call at a time is always admitted.
One client, one call at a time; the variants alternate call by call so they see the same machine. Every
measured call, on every path, has a row of its own (`shortness of breath <n>`): identical calls would share
work (workers.sharing), and the stack has warm results off, so each heavy call runs its own work (its row's
`served_as` is `run`; the script reports it):

- `heavy_wait`: POST with `Prefer: wait=30` -> 200 with the result, as the in-request endpoint answers
  (the API waits on Redis pub/sub);
- `heavy_poll`: POST -> 202, then `GET /tasks/<id>/?wait=30` (long-poll) -> the result;
- `bare_default`: the bare view, `.get()` with Celery's default poll interval of the django-db result
  backend (0.5 s);
- `bare_fast`: the same with `.get(interval=0.005)`, the fair floor: the plumbing without polling waste.

Also timed in this process: the domain work alone (concepts.services.run_match on the same body), and,
from each heavy call's row, where its time went (created -> started -> finished). Target: heavy at most
1.5x the fair floor (median). `--projection-fix` runs the worker and the in-process domain work with the
fix to TfidfSvdEmbedder.embed proposed in docs/benchmarks.md, simulated by api/bench_views.py (an
experiment: off by default; it writes bench/out/roundtrip-projection-fix.json and no plot). `--db-reuse`
likewise simulates the proposed CELERY_DB_REUSE_MAX (the worker keeps its database connection between
tasks); both flags may be combined.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from helpers import ROOT, distinct, write
from stack import Stack

TARGET = 1.5
ROW = 'shortness of breath'
VARIANTS = ('heavy_wait', 'heavy_poll', 'bare_default', 'bare_fast')


def stats_ms(samples):
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(len(ordered) * q))]  # noqa: E731
    return {'median_ms': round(statistics.median(ordered) * 1000, 2), 'p90_ms': round(pick(0.9) * 1000, 2),
            'max_ms': round(ordered[-1] * 1000, 2), 'mean_ms': round(statistics.fmean(ordered) * 1000, 2),
            'n': len(ordered)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--calls', type=int, default=60, help='calls per variant')
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--terminology', default='hpo', choices=('hpo', 'tiny'))
    parser.add_argument('--plot', default=str(ROOT / 'docs' / 'img' / 'roundtrip.png'),
                        help='PNG of the latency distributions ("" for none; needs matplotlib)')
    parser.add_argument('--projection-fix', action='store_true',
                        help='simulate the proposed TfidfSvdEmbedder.embed fix (api/bench_views.py)')
    parser.add_argument('--db-reuse', action='store_true',
                        help='simulate the proposed CELERY_DB_REUSE_MAX in the worker (api/bench_views.py)')
    args = parser.parse_args()
    env = {}
    if args.projection_fix:
        env['HEAVY_LANES_BENCH_PROJECTION_FIX'] = '1'
    if args.db_reuse:
        env['HEAVY_LANES_BENCH_DB_REUSE'] = '1'
    if env:
        os.environ.update(env)
        args.plot = ''
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)

    import requests

    with Stack(api_workers=args.api_workers, lanes={'interactive': 1}, terminology=args.terminology,
               config={'mode': 'enforce', 'enforce_for': 'all'}, env=env) as stack:
        import api.bench_views  # noqa: F401  (with --projection-fix: patches this process's embedder too)
        from concepts import services
        from workers.models import Work

        def body_of(name):
            return {'rows': [{'name': name}], 'target_repo_url': stack.source, 'limit': 5}

        body = body_of(ROW)
        session = requests.Session()
        session.headers['Authorization'] = f'Token {stack.token("core")}'
        match_url = f'{stack.url}/concepts/$match/?semantic=true'

        def heavy_wait(body):
            # Answered as the in-request endpoint would be: 200 with the result; the call's handle is named by
            # Content-Location (/tasks/<id>/).
            response = session.post(match_url, json=body, headers={'Prefer': 'wait=30'}, timeout=60)
            assert response.status_code == 200 and 'Content-Location' in response.headers, response.text
            return response.headers['Content-Location'].rstrip('/').rsplit('/', 1)[-1], response.json()

        def heavy_poll(body):
            response = session.post(match_url, json=body, headers={'Prefer': 'respond-async'}, timeout=60)
            assert response.status_code == 202, response.text
            task = session.get(f'{stack.url}{response.json()["url"]}?wait=30', timeout=60).json()
            assert task['state'] == 'succeeded', task
            return task['id'], task['result']

        def bare(interval):
            def call(body):
                response = session.post(f'{stack.url}/bench/roundtrip/?semantic=true&interval={interval}',
                                        json=body, timeout=60)
                assert response.status_code == 200, response.text
                return None, response.json()['result']
            return call

        calls = {'heavy_wait': heavy_wait, 'heavy_poll': heavy_poll, 'bare_default': bare(0.5),
                 'bare_fast': bare(0.005)}
        # Warm: the index in the pool process. The same row on every path, to compare their results.
        results = {name: call(body_of(ROW))[1] for name, call in calls.items()}
        for _ in range(3):
            for call in calls.values():
                call(body_of(distinct(ROW)))
        same = all(result == results['heavy_wait'] for result in results.values())

        samples = {name: [] for name in VARIANTS}
        heavy_ids = []
        for i in range(args.calls):
            order = VARIANTS[i % 4:] + VARIANTS[:i % 4]
            for name in order:
                call_body = body_of(distinct(ROW))
                started = time.perf_counter()
                call_id, _ = calls[name](call_body)
                samples[name].append(time.perf_counter() - started)
                if call_id:
                    heavy_ids.append(call_id)
        # The domain work alone, in this process (the index loaded once first).
        services.run_match(services.validate_match(body), semantic=True, reranker=False)
        work = []
        for _ in range(args.calls):
            started = time.perf_counter()
            services.run_match(services.validate_match(body), semantic=True, reranker=False)
            work.append(time.perf_counter() - started)
        phases = call_phases(Work.objects.filter(pk__in=heavy_ids))
        served_as = stack.served_as(heavy_ids)

    summary = {name: stats_ms(values) for name, values in samples.items()}
    summary['domain_work'] = stats_ms(work)
    fast = summary['bare_fast']['median_ms']
    ratios = {
        'heavy_wait_vs_bare_fast': round(summary['heavy_wait']['median_ms'] / fast, 2),
        'heavy_poll_vs_bare_fast': round(summary['heavy_poll']['median_ms'] / fast, 2),
        'heavy_wait_vs_bare_default': round(
            summary['heavy_wait']['median_ms'] / summary['bare_default']['median_ms'], 2),
        'bare_default_vs_bare_fast': round(summary['bare_default']['median_ms'] / fast, 2),
    }
    for name in (*VARIANTS, 'domain_work'):
        line = summary[name]
        print(f'{name:>13}: median {line["median_ms"]:8.2f} ms  p90 {line["p90_ms"]:8.2f} ms  '
              f'max {line["max_ms"]:8.2f} ms')
    for phase in ('created_to_started', 'started_to_finished'):
        line = phases[phase]
        print(f'  heavy call row, {phase}: median {line["median_ms"]} ms, p90 {line["p90_ms"]} ms, '
              f'max {line["max_ms"]} ms')
    print(f'heavy (Prefer: wait) {ratios["heavy_wait_vs_bare_fast"]}x the fair floor, heavy (long-poll) '
          f'{ratios["heavy_poll_vs_bare_fast"]}x (target <= {TARGET}); vs the default .get() '
          f'{ratios["heavy_wait_vs_bare_default"]}x; the default .get() is {ratios["bare_default_vs_bare_fast"]}x '
          f'the fair one; same results on every path: {same}')
    print(f'heavy calls by how they were served: {served_as} (every one should be run)')
    if args.plot:
        plot(args.plot, samples, work)
    name = 'roundtrip' + ('-projection-fix' if args.projection_fix else '') + ('-db-reuse' if args.db_reuse else '')
    write(name, {'projection_fix': args.projection_fix, 'db_reuse': args.db_reuse, 'calls': args.calls,
                        'api_workers': args.api_workers, 'row': ROW, 'summary': summary,
                        'ratios': ratios, 'heavy_phases_ms': phases, 'same_results': same,
                        'served_as': served_as,
                        'samples_ms': {name: [round(v * 1000, 2) for v in values] for name, values in samples.items()},
                        'targets': {'heavy_vs_bare_fast': TARGET,
                                    'met': ratios['heavy_wait_vs_bare_fast'] <= TARGET
                                    and ratios['heavy_poll_vs_bare_fast'] <= TARGET}})


def plot(path, samples, work):
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: no plot')
        return
    figure, axis = plt.subplots(figsize=(8, 4))
    labels = {'heavy_wait': 'heavy, Prefer: wait', 'heavy_poll': 'heavy, 202 + long-poll',
              'bare_default': 'bare .get() (interval 0.5 s)', 'bare_fast': 'bare .get(interval=0.005)',
              'domain': 'domain work alone (in-process)'}
    for name, values in [*samples.items(), ('domain', work)]:
        ordered = sorted(v * 1000 for v in values)
        axis.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where='post', label=labels[name])
    axis.set_xscale('log')
    axis.set_xlabel('round trip, ms (log scale)')
    axis.set_ylabel('share of calls')
    axis.set_title('One-row semantic $match, submit to result (cumulative)', fontsize=10)
    axis.legend(fontsize=8)
    axis.grid(True, which='both', alpha=0.3)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f'plot: {os.path.relpath(path, ROOT)}')


def call_phases(calls):
    """Stats of each heavy call's queue wait (created -> started) and run (started -> finished)."""
    queued, ran = [], []
    for call in calls:
        if call.started_at and call.finished_at:
            queued.append((call.started_at - call.created_at).total_seconds())
            ran.append((call.finished_at - call.started_at).total_seconds())
    return {'created_to_started': stats_ms(queued) if queued else None,
            'started_to_finished': stats_ms(ran) if ran else None,
            'started_within_50ms_share': round(sum(1 for q in queued if q < 0.05) / len(queued), 2) if queued else None}


if __name__ == '__main__':
    main()
