"""Real work: semantic `$match` rows per second per lane worker process on the shipped terminology (HPO),
from 1 to 2 worker processes, against the floor of the same domain function called in this process.

    .venv/bin/python bench/work.py [--rows 50] [--calls-per-process 20] [--processes 1,2] [--rounds 2]
                                   [--blas-threads N] [--projection-fix]

A private stack (bench/stack.py), mode shadow (every call admitted and queued), one `es2_knn` lane worker
(bulk semantic calls) whose pool is resized through the capacity config (es2_knn = reserve + processes) by
the workers' own reconciler. For each pool size P, 2P client threads keep the pool busy: each submits a
call of `--rows` lay phrases (heavy_lanes_client.phrases) with `Prefer: respond-async` and watches its row
in the database (a long-poll would hold one of the API's sync workers for the whole call), until
`--calls-per-process` x P calls finished; the sizes alternate for `--rounds` rounds (1, 2, 1, 2) and each
figure is the median over rounds. Before each round, small calls warm the pool until it has P processes
and each has run a call (a grown pool forks its new process late, and a process loads the indexes on its
first call). From the calls' rows:

- throughput: all rows / (last finish - first submit), the rate a user of the lane sees;
- per process: rows / seconds a pool process spent running calls (started -> finished), i.e. what one
  worker process does while busy;
- which pool processes ran calls (pids from the rows' `worker`) and the most calls running at one moment,
  which show that a P-process round had P processes working side by side.

Floor: `concepts.services.run_match(body, semantic=True)` on the same bodies in this process (one process,
no queue), and 100 one-row calls (p50, p90): this process runs the sentence model with one thread, as a pool
process does (CONCEPTS_MODEL_THREADS, default 1).
Scaling: throughput with 2 processes / with 1 (2.0 would be perfect; the machine has
os.cpu_count() cores shared with the API, PostgreSQL and Redis). `--blas-threads N` sets OMP/OPENBLAS/MKL
thread counts for the workers and this process (default: the libraries' own choice, as shipped).
`--projection-fix` runs the workers and the floor with the fix to TfidfSvdEmbedder.embed proposed in
docs/benchmarks.md, simulated by api/bench_views.py (an experiment: off by default).
"""
import argparse
import os
import statistics
import sys
import time
from collections import Counter

from helpers import distinct, drive, write
from stack import Stack


def phrases():
    from heavy_lanes_client.phrases import PHRASES
    return list(PHRASES)


def bodies(source, rows, count, offset=0):
    """`count` $match bodies of `rows` phrases each, cycling through the phrase list; the first row's name
    is numbered (helpers.distinct), so no two bodies are identical work (they would share one run)."""
    words = phrases()
    out = []
    for i in range(count):
        start = (offset + i * rows) % len(words)
        names = [words[(start + j) % len(words)] for j in range(rows)]
        names[0] = distinct(names[0])
        out.append({'rows': [{'name': name} for name in names], 'target_repo_url': source, 'limit': 5})
    return out


def floor(source, rows, calls):
    from concepts import services
    work = bodies(source, rows, calls, offset=7)
    services.run_match(services.validate_match(work[0]), semantic=True, reranker=False)  # load the index
    started = time.perf_counter()
    for body in work:
        services.run_match(services.validate_match(body), semantic=True, reranker=False)
    seconds = time.perf_counter() - started
    single = []
    for name in phrases()[:ONE_ROW_CALLS]:
        body = {'rows': [{'name': name}], 'target_repo_url': source, 'limit': 5}
        began = time.perf_counter()
        services.run_match(services.validate_match(body), semantic=True, reranker=False)
        single.append((time.perf_counter() - began) * 1000)
    cuts = statistics.quantiles(single, n=10)
    return {'rows': rows * calls, 'seconds': round(seconds, 3),
            'rows_per_s': round(rows * calls / seconds, 1), 'ms_per_call': round(seconds / calls * 1000, 2),
            'one_row_ms': {'calls': len(single), 'p50': round(statistics.median(single), 2),
                           'p90': round(cuts[8], 2), 'max': round(max(single), 2)}}


ONE_ROW_CALLS = 100


def pid_of(worker):
    """The pool process of a call's `worker` ('<node> pid <pid>'), or None."""
    pid = worker.rpartition(' pid ')[2]
    return int(pid) if pid.isdigit() else None


def warm_pool(stack, token, size, timeout=120):
    """Send small calls until the lane worker has `size` pool processes and each of them has run one; return
    their pids.

    A pool grown by the reconciler forks its new process only later, and a process loads the indexes on its
    first call (~2 s for HPO). Warming with a fixed handful of calls left the new process cold or unborn:
    the old one took every warm-up call, then the measured ones while the new one loaded, and the 2-process
    round measured one process (`1 pool processes ran calls`).
    """
    from workers.models import Work
    deadline = time.monotonic() + timeout
    warmed = set()
    while True:
        live = stack.pool_pids('es2_knn')
        if len(live) == size and live <= warmed:
            return live
        if time.monotonic() > deadline:
            raise RuntimeError(f'pool processes {sorted(live)} (wanted {size}), warmed {sorted(warmed)}')
        ids = drive(stack, token, bodies(stack.source, 2, 3 * size), 2 * size)
        ran = Work.objects.filter(pk__in=ids).values_list('worker', flat=True)
        warmed |= {pid_of(worker) for worker in ran}


def side_by_side(calls):
    """The most calls that ran at the same moment (from their rows' started/finished)."""
    events = sorted([(call.started_at, 1) for call in calls] + [(call.finished_at, -1) for call in calls])
    running = most = 0
    for _, step in events:  # at a tie an end sorts first: back-to-back calls don't overlap
        running += step
        most = max(most, running)
    return most


def measure(ids, rows):
    from workers.models import Call, Work
    calls = list(Work.objects.filter(pk__in=ids))  # distinct bodies: each call ran a work of its own
    first = min(call.created_at for call in calls)
    last = max(call.finished_at for call in calls)
    wall = (last - first).total_seconds()
    busy = sum((call.finished_at - call.started_at).total_seconds() for call in calls)
    runs = sorted((call.finished_at - call.started_at).total_seconds() for call in calls)
    total = rows * len(calls)
    per_process = Counter(pid_of(call.worker) for call in calls)
    return {'calls': len(calls), 'rows': total, 'wall_seconds': round(wall, 3),
            'throughput_rows_per_s': round(total / wall, 1),
            'per_process_rows_per_s': round(total / busy, 1),
            'run_ms_median': round(statistics.median(runs) * 1000, 1),
            'pool_processes_seen': len(per_process),
            'calls_per_process': sorted(per_process.values(), reverse=True),
            'most_side_by_side': side_by_side(calls),
            'served_as': dict(Counter(Call.objects.filter(pk__in=ids).values_list('served_as', flat=True)))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rows', type=int, default=50, help='rows per call')
    parser.add_argument('--calls-per-process', type=int, default=20)
    parser.add_argument('--rounds', type=int, default=2, help='times each pool size is measured, alternating')
    parser.add_argument('--processes', default='1,2', help='pool sizes to measure')
    parser.add_argument('--blas-threads', type=int, default=None)
    parser.add_argument('--projection-fix', action='store_true',
                        help='simulate the proposed TfidfSvdEmbedder.embed fix (api/bench_views.py)')
    parser.add_argument('--api-workers', type=int, default=2)
    parser.add_argument('--terminology', default='hpo', choices=('hpo', 'tiny'))
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    env = {}
    if args.blas_threads:
        env = {name: str(args.blas_threads) for name in
               ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS')}
    if args.projection_fix:
        env['HEAVY_LANES_BENCH_PROJECTION_FIX'] = '1'
    os.environ.update(env)
    sizes = [int(n) for n in args.processes.split(',')]

    with Stack(api_workers=args.api_workers, lanes={'es2_knn': sizes[0]}, terminology=args.terminology,
               config={'mode': 'shadow'}, env=env) as stack:
        token = stack.token('core')
        import api.bench_views  # noqa: F401  (with --projection-fix: patches this process's embedder too)
        base = floor(stack.source, args.rows, max(4, args.calls_per_process))
        one = base['one_row_ms']
        print(f'floor (run_match in this process): {base["rows_per_s"]} rows/s, {base["ms_per_call"]} ms per '
              f'call of {args.rows} rows; one-row calls p50 {one["p50"]} ms, p90 {one["p90"]} ms', flush=True)
        rounds = {size: [] for size in sizes}
        for round_number in range(args.rounds):
            for size in sizes:
                stack.set_config(es2_knn=1 + size)  # reserve_single_row is 1: the bulk pool is es2_knn - 1
                stack.wait_pools({'es2_knn': size})
                live = warm_pool(stack, token, size)
                stack.reset_calls(purge=False)
                ids = drive(stack, token, bodies(stack.source, args.rows, args.calls_per_process * size, round_number),
                            2 * size, interval=0.05)
                line = measure(ids, args.rows)
                line['pool_processes'] = len(live)
                rounds[size].append(line)
                print(f'round {round_number + 1}, {size} process(es): {line["throughput_rows_per_s"]} rows/s through '
                      f'the lane ({line["calls"]} calls, {line["wall_seconds"]} s), {line["per_process_rows_per_s"]} '
                      f'rows/s per busy process, median call {line["run_ms_median"]} ms; '
                      f'{line["pool_processes_seen"]} of {len(live)} pool processes ran calls '
                      f'{line["calls_per_process"]}, at most {line["most_side_by_side"]} side by side; served_as '
                      f'{line["served_as"]}', flush=True)
                stack.reset_calls(purge=False)
        phases = {size: {key: round(statistics.median(line[key] for line in lines), 1) for key in
                         ('throughput_rows_per_s', 'per_process_rows_per_s', 'run_ms_median', 'wall_seconds')}
                  | {'rounds': lines} for size, lines in rounds.items()}

    summary = {'floor_rows_per_s': base['rows_per_s'], 'one_row_p90_ms': base['one_row_ms']['p90']}
    for size, line in phases.items():
        summary[f'throughput_{size}'] = line['throughput_rows_per_s']
        summary[f'per_process_{size}'] = line['per_process_rows_per_s']
        summary[f'per_process_{size}_vs_floor'] = round(line['per_process_rows_per_s'] / base['rows_per_s'], 2)
        summary[f'side_by_side_{size}'] = min(round_line['most_side_by_side'] for round_line in line['rounds'])
    short = [size for size in sizes if summary[f'side_by_side_{size}'] < size]
    if short:
        print(f'WARNING: a round of {short} process(es) never had that many calls running at once')
    if len(sizes) >= 2:
        summary['scaling'] = round(
            phases[sizes[1]]['throughput_rows_per_s'] / phases[sizes[0]]['throughput_rows_per_s'], 2)
        print(f'{sizes[0]} -> {sizes[1]} processes: throughput x{summary["scaling"]}')
    for size, line in phases.items():
        print(f'{size} process(es), median of {args.rounds}: {line["throughput_rows_per_s"]} rows/s through the lane, '
              f'{line["per_process_rows_per_s"]} rows/s per busy process '
              f'({round(line["per_process_rows_per_s"] / base["rows_per_s"], 2)}x the floor)')
    name = 'work' + ('-projection-fix' if args.projection_fix else '') + (
        f'-blas{args.blas_threads}' if args.blas_threads else '')
    write(name, {'rows_per_call': args.rows, 'calls_per_process': args.calls_per_process, 'rounds': args.rounds,
                   'blas_threads': args.blas_threads, 'projection_fix': args.projection_fix,
                   'cpu_count': os.cpu_count(), 'floor': base,
                   'phases': phases, 'summary': summary})


if __name__ == '__main__':
    main()
