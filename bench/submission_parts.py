"""What each part of a heavy submission costs: the CPU of one heavy `POST /concepts/$match/?semantic=true` ->
202 in this process (Django's test client, `time.process_time`, so the publisher and Redis threads count
too) as it is, and with one part changed or left out, against the durable floor (/bench/durable/, see
bench/submission.py), in alternating blocks on one private stack (bench/stack.py, no lane workers).

    .venv/bin/python bench/submission_parts.py [--mode off] [--block 40] [--rounds 16]

A part left out is patched out in this process for its block only: the figures say what removing it
would save, not that it could be removed (each is what a guarantee or a feature of the 202 costs; see
docs/benchmarks.md). In-process figures leave out the HTTP server, which every path shares.
"""
import argparse
import importlib
import os
import statistics
import sys
import time

from stack import Stack
from submission import new_body, set_mode

HEAVY, DURABLE = '/concepts/$match/?semantic=true', '/bench/durable/?semantic=true'


def patch(module_name, name, value):
    """Set `module.name` to `value`; return the undo."""
    module = importlib.import_module(module_name)
    original = getattr(module, name)
    setattr(module, name, value)
    return lambda: setattr(module, name, original)


def setting(name, value):
    from django.conf import settings
    original = getattr(settings, name)
    setattr(settings, name, value)
    return lambda: setattr(settings, name, original)


def both(*undos):
    return lambda: [undo() for undo in undos]


# label -> the change (returns its undo), None for the heavy call as it is.
VARIANTS = {
    'as it is': None,
    'counters sent at each call': lambda: setting('CAPACITY_COUNTERS_GATHER_SECONDS', 0),
    'work and call saved one by one': lambda: patch('workers.lifecycle.statements', 'available', lambda: False),
    'without the broker lists read (position)': lambda: patch('workers.lifecycle.reads', 'published_position',
                                                              lambda work: 1),
    'without the claim (SET NX)': lambda: patch('workers.sharing', 'lead', lambda key, work_id, config=None: True),
    'without the look and the claim': lambda: both(
        patch('workers.sharing', 'find', lambda key, config=None: None),
        patch('workers.sharing', 'lead', lambda key, work_id, config=None: True)),
    'publish on the request thread': lambda: patch('workers.publisher', 'publish',
                                                   lambda send, *args, **kwargs: send(*args, **kwargs)),
    'without counters': lambda: patch('capacity.counters', 'increment', lambda *fields, minutes=(): None),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--mode', default='off', choices=('off', 'shadow', 'enforce'))
    parser.add_argument('--block', type=int, default=40, help='calls per block')
    parser.add_argument('--rounds', type=int, default=16, help='blocks of each variant')
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    with Stack(api_workers=1, lanes={}) as stack:
        from django.test import Client
        client = Client(HTTP_AUTHORIZATION=f'Token {stack.token("core")}', HTTP_PREFER='respond-async')
        set_mode(stack, args.mode)
        for _ in range(40):  # warm: connections, caches
            for path in (HEAVY, DURABLE):
                client.post(path, new_body(stack), content_type='application/json')
        stack.reset_calls()
        names = [*VARIANTS, 'durable floor']
        cpu = {name: [] for name in names}
        for round_number in range(args.rounds):
            for name in names[round_number % len(names):] + names[:round_number % len(names)]:
                change = VARIANTS.get(name)
                undo = change() if change else None
                bodies = [new_body(stack) for _ in range(args.block)]
                started = time.process_time()
                try:
                    for body in bodies:
                        response = client.post(DURABLE if name == 'durable floor' else HEAVY, body,
                                               content_type='application/json')
                        assert response.status_code == 202, response.content
                finally:
                    if undo:
                        undo()
                cpu[name].append((time.process_time() - started) / args.block * 1000)
            stack.reset_calls()
    load = open('/proc/loadavg').read().split()[:3]
    print(f'mode {args.mode}, {args.rounds} blocks of {args.block} calls each, load {" ".join(load)}')
    now = statistics.median(cpu['as it is'])
    for name in names:
        median = statistics.median(cpu[name])
        quartiles = statistics.quantiles(cpu[name])
        print(f'{median:7.3f} ms CPU/call ({quartiles[0]:.3f}-{quartiles[2]:.3f}), {median - now:+.3f}  {name}')


if __name__ == '__main__':
    main()
