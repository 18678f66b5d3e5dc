"""What serving the largest allowed answer costs the API processes: their RSS before, at the peak and after.

    .venv/bin/python bench/answer_memory.py [--readers 6] [--rounds 3] [--slice-characters N]
    .venv/bin/python bench/answer_memory.py --case lexical [--readers 16] [--rounds 3] [--echo-bytes N]

`--case stored` (the default): the largest answer any admitted call can have is a `$match` of
MAX_MATCH_CANDIDATES candidates taking up to MAX_ANSWER_BYTES rendered (concepts.bounds). This stores one of
that shape and size as a succeeded call's result, the way a worker stores one (Celery's result backend, the
candidates counted on its work), on a
private stack (bench/stack.py: gunicorn with 2 workers as docker-compose runs it, PostgreSQL, no lane
workers: nothing here runs), then has `--readers` clients GET `/tasks/<id>/` at once, `--rounds` times,
reading every byte. A sampler reads each gunicorn worker's RSS (/proc/<pid>/status, VmRSS) every 20 ms.
Reported per worker: before (after warm-up reads of a small task), the peak, and 5 s and 30 s after the
last read. Writes bench/out/answer_memory.json; the figures of docs/benchmarks.md come from it.

`--case lexical`: a lexical `$match`, which the API process runs and answers itself. `--readers` clients
(16 here) POST at once, `--rounds` times, the body of issue 42: 1,000 rows and a 29 KB `map_config`
(57 KB), which OCL's format echoes in every row's entry (a 29.5 MB answer). With the default bounds that
body is a 400 (MAX_ECHO_BYTES); `--echo-bytes N` starts the API with MAX_ECHO_BYTES=N (e.g. 67108864) so
the answer is made and sent. Besides the RSS, a client GETs `/healthz` every 100 ms throughout and the
slowest answer is reported. Writes bench/out/answer_memory_lexical.json.
"""
import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault('BENCH_DB_NAME', 'heavy_lanes_bench_memory')  # beside another benchmark's stack
from bench.helpers import write  # noqa: E402
from bench.stack import Stack  # noqa: E402


def candidate(row, rank, padding):
    return {'id': f'HP:{row:04d}{rank:02d}', 'type': 'Concept', 'retired': False,
            'url': f'/orgs/HPO/sources/HPO/concepts/HP:{row:04d}{rank:02d}/',
            'version_url': f'/orgs/HPO/sources/HPO/2024-01-01/concepts/HP:{row:04d}{rank:02d}/',
            'display_name': f'Phenotypic abnormality {row} of kind {rank}', 'concept_class': 'Phenotype',
            'datatype': 'N/A', 'names': [{'name': f'abnormality {row}/{rank}', 'locale': 'en',
                                          'type': 'SYNONYM'}],
            'descriptions': [{'description': padding, 'locale': 'en'}],
            'search_meta': {'search_score': 12.5 - rank, 'search_rerank_score': None,
                            'search_confidence': 'high', 'search_highlight': {}, 'match_type': 'high',
                            'search_normalized_score': 0.9, 'algorithm': 'ocl-semantic'}}


def largest_answer(candidates, most_bytes):
    """A `$match` answer of `candidates` candidates (10 a row) whose JSON is just under `most_bytes`."""
    rows = candidates // 10

    def answer(padding):
        return [{'row': {'name': f'row {row}'}, 'results': [candidate(row, rank, padding) for rank in range(10)],
                 'map_config': [], 'filter': {}} for row in range(rows)]
    bare = len(json.dumps(answer('')).encode())
    padding = 'x' * max(0, (most_bytes - bare) // candidates - 1)
    return answer(padding)


def rss_kb(pid):
    try:
        for line in Path(f'/proc/{pid}/status').read_text().splitlines():
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def gunicorn_workers(master_pid):
    return sorted(int(pid) for pid in Path(f'/proc/{master_pid}/task/{master_pid}/children').read_text().split())


def read_all(url, token):
    request = urllib.request.Request(url, headers={'Authorization': f'Token {token}'})
    with urllib.request.urlopen(request, timeout=300) as response:
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
        return response.status, size


def store_succeeded_call(user, result, count):
    """A succeeded call with `result` stored as a worker stores it (workers.lifecycle.running.succeed)."""
    from celery import states
    from django.utils import timezone

    from workers.celery import app
    from workers.models import Call, State, Work
    now = timezone.now()
    work = Work.objects.create(id=uuid.uuid4().hex, endpoint='$match', semantic=True, rows=len(result),
                               payload={'rows': []}, queue='es2_knn', state=State.SUCCEEDED, attempts=1,
                               answer_count=count, created_at=now, expires_at=now + timedelta(minutes=10),
                               started_at=now, finished_at=now)
    app.backend.store_result(work.pk, result, states.SUCCESS)
    return Call.objects.create(id=work.pk, owner=user, work=work, endpoint='$match', rows=len(result),
                               fingerprint='bench', created_at=now)


LEXICAL_SOURCE = '/orgs/HL/sources/TinyClinical/'  # the tiny terminology's source


def lexical_body():
    """Issue 42's body: 1,000 rows and a 29 KB map_config, 57 KB in all."""
    return {'rows': [{'name': f'chest pain {row}'} for row in range(1000)], 'target_repo_url': LEXICAL_SOURCE,
            'map_config': [{'target': 'x' * 29_000}]}


def post_all(url, token, body):
    """POST `body` as JSON and read every byte of the answer: (status, bytes)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method='POST', headers={
        'Authorization': f'Token {token}', 'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            size = 0
            while chunk := response.read(1 << 20):
                size += len(chunk)
            return response.status, size
    except urllib.error.HTTPError as ex:
        return ex.code, len(ex.read())


class Sampler:
    """Each of `pids`' peak VmRSS, read every 20 ms; with `health_url`, the slowest GET of it (every 100 ms)."""

    def __init__(self, pids, health_url=None):
        self.pids = pids
        self.peak = {pid: rss_kb(pid) for pid in pids}
        self.health_url = health_url
        self.health_ms = []
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self.sample, daemon=True)]
        if health_url:
            self.threads.append(threading.Thread(target=self.probe, daemon=True))

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for thread in self.threads:
            thread.join()

    def sample(self):
        while not self.done.is_set():
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], rss_kb(pid) or 0)
            time.sleep(0.02)

    def probe(self):
        while not self.done.is_set():
            started = time.monotonic()
            with urllib.request.urlopen(self.health_url, timeout=60) as response:
                response.read()
            self.health_ms.append((time.monotonic() - started) * 1000)
            self.done.wait(0.1)


def lexical(args):
    """The `--case lexical` run (see the module docstring)."""
    env = {'MAX_ECHO_BYTES': str(args.echo_bytes)} if args.echo_bytes else {}
    with Stack(api_workers=2, lanes={}, terminology='tiny', bench_views=False, env=env) as stack:
        token = stack.token('core')
        url = f'{stack.url}/concepts/$match/'
        body = lexical_body()
        small = {**body, 'rows': body['rows'][:1], 'map_config': []}
        for _ in range(20):  # warm both workers: the source's index loaded, its candidates measured
            post_all(url, token, small)
        workers = gunicorn_workers(stack.children['api'].pid)
        time.sleep(1)
        before = {pid: rss_kb(pid) for pid in workers}
        statuses, sizes, seconds = [], [], []
        with Sampler(workers, f'{stack.url}/healthz') as sampler:
            time.sleep(1)
            idle_health = list(sampler.health_ms)
            for _ in range(args.rounds):
                results = []
                started = time.monotonic()
                clients = [threading.Thread(target=lambda out=results: out.append(post_all(url, token, body)))
                           for _ in range(args.readers)]
                for client in clients:
                    client.start()
                for client in clients:
                    client.join()
                seconds.append(round(time.monotonic() - started, 2))
                statuses.extend(status for status, _ in results)
                sizes.extend(size for _, size in results)
            busy_health = sampler.health_ms[len(idle_health):]
        time.sleep(5)
        after_5 = {pid: rss_kb(pid) for pid in workers}
        time.sleep(25)
        after_30 = {pid: rss_kb(pid) for pid in workers}
        mb = 1024
        figures = {
            'case': 'lexical', 'body_bytes': len(json.dumps(body)), 'answer_bytes': max(sizes),
            'statuses': {str(code): statuses.count(code) for code in sorted(set(statuses))},
            'echo_bound_bytes': args.echo_bytes, 'readers': args.readers, 'rounds': args.rounds,
            'round_seconds': seconds,
            'healthz_ms': {'idle_max': round(max(idle_health, default=0), 1),
                           'busy_max': round(max(busy_health, default=0), 1),
                           'busy_median': round(sorted(busy_health)[len(busy_health) // 2], 1)
                           if busy_health else None, 'busy_probes': len(busy_health)},
            'workers': [{'before_mb': round(before[pid] / mb, 1), 'peak_mb': round(sampler.peak[pid] / mb, 1),
                         'after_5s_mb': round(after_5[pid] / mb, 1), 'after_30s_mb': round(after_30[pid] / mb, 1)}
                        for pid in workers],
        }
    data = write('answer_memory_lexical', figures)
    print(json.dumps(data, indent=2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--case', choices=('stored', 'lexical'), default='stored')
    parser.add_argument('--readers', type=int, default=None, help='clients at once (stored: 6, lexical: 16)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--slice-characters', type=int, default=None,
                        help='RESULT_SLICE_CHARACTERS of the API (default: its own, 4 MiB)')
    parser.add_argument('--echo-bytes', type=int, default=None,
                        help='lexical: MAX_ECHO_BYTES of the API (default: its own, 4 MiB: the body is a 400)')
    args = parser.parse_args()
    if args.case == 'lexical':
        args.readers = args.readers or 16
        return lexical(args)
    args.readers = args.readers or 6
    env = {'RESULT_SLICE_CHARACTERS': str(args.slice_characters)} if args.slice_characters else {}
    with Stack(api_workers=2, lanes={}, terminology='tiny', bench_views=False, env=env) as stack:
        from django.conf import settings
        from rest_framework.authtoken.models import Token
        token = stack.token('core')
        user = Token.objects.get(key=token).user
        answer = largest_answer(settings.MAX_MATCH_CANDIDATES, settings.MAX_ANSWER_BYTES)
        stored = store_succeeded_call(user, answer, settings.MAX_MATCH_CANDIDATES)
        small = store_succeeded_call(user, answer[:1], 10)
        del answer
        workers = gunicorn_workers(stack.children['api'].pid)
        for _ in range(20):  # warm both workers on a small answer
            read_all(f'{stack.url}/tasks/{small.pk}/', token)
        time.sleep(1)
        before = {pid: rss_kb(pid) for pid in workers}
        peak = dict(before)
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                for pid in workers:
                    peak[pid] = max(peak[pid], rss_kb(pid) or 0)
                time.sleep(0.02)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        sizes, seconds = [], []
        for _ in range(args.rounds):
            results = []
            started = time.monotonic()
            readers = [threading.Thread(target=lambda out=results: out.append(read_all(
                f'{stack.url}/tasks/{stored.pk}/', token))) for _ in range(args.readers)]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join()
            seconds.append(round(time.monotonic() - started, 2))
            assert all(status == 200 for status, _ in results), results
            sizes.extend(size for _, size in results)
        time.sleep(5)
        after_5 = {pid: rss_kb(pid) for pid in workers}
        time.sleep(25)
        after_30 = {pid: rss_kb(pid) for pid in workers}
        sampling.set()
        sampler.join()
        mb = 1024
        figures = {
            'answer_bytes': max(sizes), 'candidates': settings.MAX_MATCH_CANDIDATES,
            'bound_bytes': settings.MAX_ANSWER_BYTES, 'readers': args.readers, 'rounds': args.rounds,
            'round_seconds': seconds,
            'workers': [{'before_mb': round(before[pid] / mb, 1), 'peak_mb': round(peak[pid] / mb, 1),
                         'after_5s_mb': round(after_5[pid] / mb, 1), 'after_30s_mb': round(after_30[pid] / mb, 1)}
                        for pid in workers],
        }
    data = write('answer_memory', figures)
    print(json.dumps(data, indent=2))


if __name__ == '__main__':
    main()
