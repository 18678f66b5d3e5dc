"""Waiting is cheap: 64 requests waiting in the request on one API host, while another client submits and
polls. Does the other client notice?

    .venv/bin/python bench/waiting.py [--waiting 64] [--rows 20] [--api-workers 2] [--rounds 2]

The stack (bench/stack.py): gunicorn with the production serving model (api/gunicorn_config.py: gthread,
`--api-workers` processes of API_THREADS=64 threads), the `es2_knn` lane with a pool of 1 (so 64 calls of
`--rows` semantic rows queue behind each other and each takes a few seconds to come back), `interactive`
with a pool of 1, shadow mode, identical work off (`cache.ttl_seconds` 0 and distinct rows).

Each round runs two phases with the same heavy work, side by side, in alternating order:
- **waiting**: the 64 calls are sent without `Prefer: respond-async`: each request waits in the API for its
  result (OCL's in-request contract) and must answer 200 with the body;
- **handles**: the same 64 calls with `Prefer: respond-async` (202 at once; the client collects their results
  later), so the API holds no waiting request but the workers do the same work.
During each phase another client, on its own connection, submits single-row semantic calls with
`Prefer: respond-async` (the `interactive` queue) and polls each handle (`GET /tasks/<id>/`, no wait) every
50 ms until it ends; every submit and every poll is timed. The phase ends when the 64 calls are done.

Target (issue 13): every waiting request gets its 200, nothing is refused for lack of API workers, and the
other client's submit and poll latency (p50, p99) with 64 waiting requests is within 10 % of the handles
phase. Results: bench/out/waiting.json.
"""
import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stack import Stack  # noqa: E402

TARGET = 1.10
POLL_SECONDS = 0.05


def percentile(values, share):
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def stats_ms(values):
    return {'count': len(values), 'p50_ms': round(percentile(values, 0.5) * 1000, 2),
            'p99_ms': round(percentile(values, 0.99) * 1000, 2), 'max_ms': round(max(values) * 1000, 2)}


class OtherClient(threading.Thread):
    """Submits one-row calls and polls each to its end, timing every request, until stopped."""

    def __init__(self, stack, tag):
        super().__init__(daemon=True)
        import requests
        self.session = requests.Session()
        self.session.headers.update({'Authorization': f'Token {stack.token("early_access")}',
                                     'Prefer': 'respond-async'})
        self.stack, self.tag = stack, tag
        self.stopping = threading.Event()
        self.submits, self.polls, self.errors = [], [], []

    def run(self):
        number = 0
        url = f'{self.stack.url}/concepts/$match/?semantic=true&limit=3'
        while not self.stopping.is_set():
            number += 1
            body = {'rows': [{'name': f'chest pain {self.tag} {number}'}], 'target_repo_url': self.stack.source}
            started = time.perf_counter()
            response = self.session.post(url, json=body, timeout=60)
            self.submits.append(time.perf_counter() - started)
            if response.status_code != 202:
                self.errors.append(f'submit {response.status_code}')
                continue
            task_url = f'{self.stack.url}{response.json()["url"]}'
            while not self.stopping.is_set():
                started = time.perf_counter()
                task = self.session.get(task_url, timeout=60)
                self.polls.append(time.perf_counter() - started)
                if task.status_code != 200:
                    self.errors.append(f'poll {task.status_code}')
                    break
                if task.json()['state'] not in ('queued', 'running'):
                    break
                time.sleep(POLL_SECONDS)


def heavy_calls(stack, count, rows, tag, wait):
    """Send `count` calls of `rows` distinct rows at once; return (statuses, seconds until all ended)."""
    import requests
    statuses = [None] * count
    url = f'{stack.url}/concepts/$match/?semantic=true&limit=5'
    token = stack.token('core')
    barrier = threading.Barrier(count)

    def one(index):
        session = requests.Session()
        headers = {'Authorization': f'Token {token}'}
        if not wait:
            headers['Prefer'] = 'respond-async'
        body = {'rows': [{'name': f'high blood pressure {tag} {index} {i}'} for i in range(rows)],
                'target_repo_url': stack.source}
        barrier.wait()
        response = session.post(url, json=body, headers=headers, timeout=900)
        ok = response.status_code == 200 and isinstance(response.json(), list) and len(response.json()) == rows
        statuses[index] = (response.status_code if ok or response.status_code != 200 else 'bad body',
                           response.json().get('id') if response.status_code == 202 else None)
    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not wait:  # the handles' calls: until the workers finished them all
        from workers.models import OPEN_STATES, Work
        ids = [call_id for _, call_id in statuses if call_id]
        while Work.objects.filter(calls__in=ids, state__in=OPEN_STATES).exists():
            time.sleep(0.1)
    return [status for status, _ in statuses], time.perf_counter() - started


def phase(stack, name, args, round_number):
    other = OtherClient(stack, f'{name}{round_number}')
    other.start()
    time.sleep(1.0)  # the other client's steady state first
    statuses, seconds = heavy_calls(stack, args.waiting, args.rows, f'{name}{round_number}', name == 'waiting')
    other.stopping.set()
    other.join(60)
    return {'statuses': {str(s): statuses.count(s) for s in set(statuses)}, 'seconds': round(seconds, 2),
            'submits': other.submits, 'polls': other.polls, 'errors': other.errors}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--waiting', type=int, default=64)
    parser.add_argument('--rows', type=int, default=20)
    parser.add_argument('--api-workers', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=2)
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    from bench.helpers import write

    wide = {'staff': 500, 'core': 500, 'early_access': 500, 'preview': 500}
    config = {'mode': 'shadow', 'es2_knn': 1, 'per_user': wide, 'tiers': wide, 'cache': {'ttl_seconds': 0},
              'api_heavy': {'cluster': 500, 'per_task': args.waiting}}
    with Stack(api_workers=args.api_workers, lanes={'interactive': 1, 'es2_knn': 1}, config=config) as stack:
        stack.wait_pools({'interactive': 1, 'es2_knn': 1})
        heavy_calls(stack, 4, args.rows, 'warm', True)  # load the index in the pool processes
        samples = {'waiting': {'submits': [], 'polls': []}, 'handles': {'submits': [], 'polls': []}}
        rounds = []
        for number in range(args.rounds):
            for name in (('waiting', 'handles') if number % 2 == 0 else ('handles', 'waiting')):
                result = phase(stack, name, args, number)
                samples[name]['submits'] += result['submits']
                samples[name]['polls'] += result['polls']
                rounds.append({'round': number, 'phase': name, 'statuses': result['statuses'],
                               'seconds': result['seconds'], 'other_client_errors': result['errors'],
                               'other_client_requests': len(result['submits']) + len(result['polls'])})
                print(f'round {number} {name:>8}: heavy answers {result["statuses"]} in {result["seconds"]} s; '
                      f'other client: {len(result["submits"])} submits, {len(result["polls"])} polls, '
                      f'errors {result["errors"] or "none"}', flush=True)

    summary = {name: {kind: stats_ms(values) for kind, values in kinds.items()} for name, kinds in samples.items()}
    ratios = {f'{kind}_{p}': round(summary['waiting'][kind][f'{p}_ms'] / summary['handles'][kind][f'{p}_ms'], 3)
              for kind in ('submits', 'polls') for p in ('p50', 'p99')}
    all_200 = all(r['statuses'] == {'200': args.waiting} for r in rounds if r['phase'] == 'waiting')
    no_errors = not any(r['other_client_errors'] for r in rounds)
    for name in ('waiting', 'handles'):
        for kind in ('submits', 'polls'):
            line = summary[name][kind]
            print(f'{name:>8} {kind:>7}: p50 {line["p50_ms"]:7.2f} ms  p99 {line["p99_ms"]:7.2f} ms  '
                  f'max {line["max_ms"]:8.2f} ms  ({line["count"]})')
    print(f'waiting / handles: {ratios} (target <= {TARGET}); every waiting request 200: {all_200}; '
          f'other client never refused: {no_errors}')
    write('waiting', {'args': vars(args), 'rounds': rounds, 'summary': summary, 'ratios': ratios,
                      'targets': {'latency_ratio_max': TARGET, 'all_waiting_200': all_200,
                                  'other_client_never_refused': no_errors,
                                  'met': all_200 and no_errors and all(v <= TARGET for v in ratios.values())}})


if __name__ == '__main__':
    main()
