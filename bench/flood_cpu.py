"""Where a bulk call's CPU goes, in both worlds of bench/flood.py: CPU per call by process, and the Heavy Lanes
pool processes' time between one call and the next.

The flood's bulk rows/s on one machine come down to CPU per call: the cores are busy in both worlds. This
sends `--calls` bulk calls (20 rows each, as the flood's bulk users send them) with `--senders` in flight,
nothing else, to each world's stack in turn, and reads from /proc the CPU every process spent meanwhile,
grouped (the in-request world's sync workers; Heavy Lanes' lane workers by queue, its API, PostgreSQL,
Redis, this load generator, the rest). For Heavy Lanes it also reads from the works' rows how long each
bulk pool process went from finishing one call to starting the next (the claim, the recorded end, the
release, Celery's acknowledgement and its next message: while it waits for these it runs no work), and,
where PostgreSQL has pg_stat_statements loaded (`shared_preload_libraries`), the statements a call cost,
most frequent first. Figures per call are totals over the round divided by the calls answered.

    .venv/bin/python bench/flood_cpu.py [--calls 300] [--senders 4] [--rounds 2] [--worlds in_request,heavy_lanes]

`--senders 64` is the flood's N = 32. Writes bench/out/flood_cpu.json.
"""
import argparse
import collections
import os
import random
import sys
import threading
import time

from flood import BULK_ROWS, rows_body, semantic, session_for, started
from helpers import write
from stack import PG_ADMIN_URL

TICKS = os.sysconf('SC_CLK_TCK')
GROUPS = (('-Q es2_knn', 'es2_knn workers'), ('-Q interactive', 'interactive workers'),
          ('-Q api_heavy', 'api_heavy workers'), ('worker-class sync', 'in-request sync workers'),
          ('gunicorn', 'Heavy Lanes API'), ('postgres', 'PostgreSQL'), ('redis-server', 'Redis'),
          ('flood_cpu', 'load generator'))


def group(cmdline):
    return next((name for key, name in GROUPS if key in cmdline), 'other')


def cpu_by_process():
    """{pid: (cpu seconds so far, its group, whether it is a main process)} of every process now: a process
    whose parent is of another group is a main one (a lane worker node's consumer, a gunicorn master); one
    whose parent is of its own group is a child (a pool process, a gunicorn worker)."""
    found, parents = {}, {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as stat, open(f'/proc/{pid}/cmdline', 'rb') as cmdline:
                fields, command = stat.read().rpartition(')')[2].split(), cmdline.read()
        except OSError:
            continue  # gone meanwhile
        found[pid] = ((int(fields[11]) + int(fields[12])) / TICKS, group(command.replace(b'\0', b' ').decode()))
        parents[pid] = fields[1]
    return {pid: (cpu, name, found.get(parents[pid], (0, None))[1] != name) for pid, (cpu, name) in found.items()}


def idle_seconds():
    with open('/proc/stat') as stat:
        fields = stat.readline().split()
    return (int(fields[4]) + int(fields[5])) / TICKS


class Statements:
    """pg_stat_statements over one round, when the server has it loaded; else nothing."""

    def __init__(self):
        import psycopg
        try:
            self.db = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
            self.db.execute('CREATE EXTENSION IF NOT EXISTS pg_stat_statements')
            self.db.execute('SELECT pg_stat_statements_reset()')
        except psycopg.Error as ex:
            print(f'[flood_cpu] no statement counts: {str(ex).strip()}', flush=True)
            self.db = None

    def per_call(self, calls, top=12):
        if self.db is None:
            return None
        rows = self.db.execute("SELECT calls, total_exec_time, query FROM pg_stat_statements "
                               "WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY calls DESC").fetchall()
        self.db.close()
        return {'statements_per_call': round(sum(row[0] for row in rows) / calls, 1),
                'top': [[round(count / calls, 2), ' '.join(query.split())[:120]] for count, _, query in rows[:top]]}


def send(world, stack, calls, senders):
    """`calls` bulk calls, `senders` at a time; the samples."""
    random.seed(20261204)  # the same rows in every world and round (each call's first row is still distinct)
    left, lock, samples = [calls], threading.Lock(), []

    def sender():
        session = session_for(stack.token('core'))
        while True:
            with lock:
                if not left[0]:
                    return
                left[0] -= 1
            samples.append(semantic(world, session, 'bulk', rows_body(stack.source, BULK_ROWS)))
    threads = [threading.Thread(target=sender) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def pool_gaps(calls):
    """The bulk pool processes' gaps between their calls, from the last `calls` bulk works' rows (ms)."""
    from workers.models import Work
    rows = list(Work.objects.filter(queue='es2_knn', rows=BULK_ROWS).exclude(started_at=None).exclude(
        finished_at=None).order_by('-started_at').values_list('worker', 'started_at', 'finished_at')[:calls])
    by_process = collections.defaultdict(list)
    for worker, started_at, finished_at in sorted(rows, key=lambda row: row[1]):
        by_process[worker].append((started_at, finished_at))
    runs, gaps = [], []
    for process in by_process.values():
        for earlier, later in zip(process, process[1:]):
            gaps.append((later[0] - earlier[1]).total_seconds() * 1000)
            runs.append((later[1] - later[0]).total_seconds() * 1000)
    if not gaps:
        return None
    gaps.sort()
    return {'processes': len(by_process), 'gap_p50_ms': round(gaps[len(gaps) // 2], 1),
            'gap_p90_ms': round(gaps[int(len(gaps) * 0.9)], 1),
            'gap_share': round(sum(gaps) / (sum(gaps) + sum(runs)), 3)}


def measure(world, stack, calls, senders, heavy_lanes):
    statements = Statements() if heavy_lanes else None
    before, idle_before, started = cpu_by_process(), idle_seconds(), time.monotonic()
    samples = send(world, stack, calls, senders)
    seconds, after, idle = time.monotonic() - started, cpu_by_process(), idle_seconds() - idle_before
    answered = sum(sample.ok for sample in samples)
    spent, main_spent = collections.Counter(), collections.Counter()
    for pid, (cpu, name, main) in after.items():
        spent[name] += cpu - before.get(pid, (0.0, name, main))[0]
        if main and name.endswith(' workers'):
            main_spent[name] += cpu - before.get(pid, (0.0, name, main))[0]
    figure = {'calls': calls, 'answered': answered, 'seconds': round(seconds, 1),
              'rows_per_s': round(answered * BULK_ROWS / seconds, 1), 'idle_cpu_s': round(idle, 1),
              'cpu_ms_per_call': round(sum(spent.values()) / answered * 1000, 1),
              'by_process_ms_per_call': {name: round(cpu / answered * 1000, 1)
                                         for name, cpu in spent.most_common() if cpu > 0},
              # of a lane worker node's share, its main process (Celery's consumer: the broker, the acks,
              # handing messages to the pool) apart from its pool processes
              'main_process_ms_per_call': {name: round(cpu / answered * 1000, 1)
                                           for name, cpu in main_spent.most_common() if cpu > 0}}
    if heavy_lanes:
        figure['pool_gaps'] = pool_gaps(calls)
        figure['database'] = statements.per_call(answered)
    print(f"[{world.name}] {figure['answered']}/{calls} answered in {figure['seconds']} s, {figure['rows_per_s']} "
          f"rows/s, {figure['cpu_ms_per_call']} ms CPU a call: {figure['by_process_ms_per_call']} (main processes "
          f"{figure['main_process_ms_per_call']})"
          + (f"; pool gaps {figure['pool_gaps']}; {(figure['database'] or {}).get('statements_per_call')} "
             f"statements a call" if heavy_lanes else ''), flush=True)
    return figure


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--calls', type=int, default=300)
    parser.add_argument('--senders', type=int, default=4, help='bulk calls in flight (the flood N=32 has 64)')
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--worlds', default='in_request,heavy_lanes')
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    results = {}
    for name in args.worlds.split(','):
        with started(name) as (world, stack):
            # More warm-up than flood.started's 4 s, not measured: at its first call each API process measures
            # the source's largest candidate (concepts.bounds: about a second of CPU for HPO, 114 of 737
            # py-spy samples of the API in a round without this), and every call here is answered first.
            send(world, stack, args.senders * 2, args.senders)
            results[name] = [measure(world, stack, args.calls, args.senders, name != 'in_request')
                             for _ in range(args.rounds)]
    write('flood_cpu', {'worlds': results, 'settings': vars(args)})


if __name__ == '__main__':
    main()
