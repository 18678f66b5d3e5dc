"""The command line: `heavy-lanes match|rerank|sources|status|load ...`, also run as
`python -m heavy_lanes_client` (docs/client.md).

Exit codes: 0 every row ran (matched or no match) / every load call accounted for; 1 some rows failed /
some load calls unaccounted; 2 bad arguments or input; 130 interrupted (Ctrl-C: tasks in flight were
cancelled first). The token can come from HEAVY_LANES_TOKEN (and the staff token from
HEAVY_LANES_STAFF_TOKEN) instead of the command line, where other users of the machine could see it.
"""
import argparse
import json
import os
import sys
from dataclasses import asdict

from heavy_lanes_client import __version__, errors
from heavy_lanes_client.client import Client
from heavy_lanes_client.load import LoadGenerator
from heavy_lanes_client.load_plan import DEFAULT_MIX, LoadPlan, parse_mix, parse_token_arg, read_accounts
from heavy_lanes_client.load_report import format_load_report
from heavy_lanes_client.progress import Progress
from heavy_lanes_client.retry import RetryPolicy
from heavy_lanes_client.rows import candidate_fields, demo_rows, parse_rows_arg, read_rows_file, write_output
from heavy_lanes_client.run import PollPolicy, Run
from heavy_lanes_client.summary import format_summary, table

DEFAULT_URL = 'http://127.0.0.1:8000'
MAX_PRINTED_ROWS = 100
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _connection_options(parser, token=True):
    parser.add_argument('--url', default=os.environ.get('HEAVY_LANES_URL', DEFAULT_URL),
                        help=f'API base URL (default: $HEAVY_LANES_URL or {DEFAULT_URL})')
    if token:
        parser.add_argument('--token', default=os.environ.get('HEAVY_LANES_TOKEN'),
                            help='API token (default: $HEAVY_LANES_TOKEN)')
    parser.add_argument('--timeout', type=float, default=30.0,
                        help='read timeout of one request, s (default 30)')


def _row_options(parser, required=True, what='rows'):
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument('--rows', help=f'{what} as comma-separated names: "a,b,c"')
    group.add_argument('--rows-file', help=f'{what} from a .csv/.tsv (a "name" column, or the first column), '
                                           '.json or text file (one per line)')
    group.add_argument('--demo-rows', type=int, metavar='N', help=f'N built-in lay symptom phrases as {what}')
    parser.add_argument('--seed', type=int, help='shuffle the demo phrases with this seed')


def _run_options(parser):
    parser.add_argument('--max-concurrency', type=int, default=4,
                        help='never more calls in flight than this, whatever the server suggests (default 4)')
    parser.add_argument('--max-attempts', type=int, default=10,
                        help='sends of one call, retries included (10)')
    parser.add_argument('--max-wait', type=float, default=900.0,
                        help='seconds one call may spend waiting out 429s and errors before it fails (900)')
    parser.add_argument('--long-poll', type=int, default=20, help='seconds per task poll, ?wait=N (20)')
    parser.add_argument('--task-timeout', type=float, default=1800.0,
                        help='seconds to wait for one task before cancelling it (1800)')
    parser.add_argument('--run-id', help='reuse the Idempotency-Keys of an earlier run (same rows and batch '
                                         'size) to pick up its tasks instead of submitting again')
    parser.add_argument('--output', '-o', help='write every row\'s outcome to this .json or .csv file')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar on stderr')
    parser.add_argument('--wait-paused', action='store_true',
                        help='wait out a paused lane (429 with "paused": true) like any refusal, within '
                             '--max-wait; without it the run stops at the first such refusal')


def program_name():
    """`heavy-lanes` when run as the installed command, else how `python -m` runs it."""
    return 'heavy-lanes' if os.path.basename(sys.argv[0] or '').startswith('heavy-lanes') else (
        'python -m heavy_lanes_client')


def build_parser():
    parser = argparse.ArgumentParser(prog=program_name(),
                                     description='Client and load generator for the Heavy Lanes API.')
    parser.add_argument('--version', action='version', version=f'%(prog)s {__version__}')
    commands = parser.add_subparsers(dest='command', required=True)

    match = commands.add_parser('match', help='match rows against a source, in batches')
    _connection_options(match)
    match.add_argument('--source', required=True, help='target_repo_url, e.g. /orgs/HPO/sources/HPO/')
    _row_options(match)
    match.add_argument('--semantic', action='store_true', help='semantic (embedding) matching')
    match.add_argument('--reranker', action='store_true', help='rerank the candidates')
    match.add_argument('--batch', type=int, default=25, help='rows per call (default 25, at most 1000)')
    match.add_argument('--limit', type=int, default=5, help='candidates per row (default 5)')
    _run_options(match)

    rerank = commands.add_parser('rerank', help='rerank candidate rows for one or more queries')
    _connection_options(rerank)
    rerank.add_argument('--q', action='append', default=[], help='a query (repeat for several)')
    rerank.add_argument('--queries-file', help='queries, one per line')
    _row_options(rerank, what='candidate rows')
    _run_options(rerank)

    sources = commands.add_parser('sources', help='list the loaded sources')
    _connection_options(sources)

    status = commands.add_parser('status', help='print /capacity/status/ (staff token)')
    _connection_options(status)

    load = commands.add_parser('load', help='load generator: N users of mixed tiers for a set time')
    _connection_options(load, token=False)
    load.add_argument('--users', type=int, default=8, help='simulated users (default 8)')
    load.add_argument('--seconds', type=float, default=30.0,
                      help='how long users send new calls (default 30)')
    load.add_argument('--tokens', help='JSON file: {"tokens": [{"token": "...", "tier": "core"}, ...]}')
    load.add_argument('--token', action='append', default=[], metavar='TIER:KEY',
                      help='a token and its tier (repeatable)')
    load.add_argument('--staff-token', default=os.environ.get('HEAVY_LANES_STAFF_TOKEN'),
                      help='samples /capacity/status/ for the largest in-flight per lane')
    load.add_argument('--source', help='target_repo_url for $match calls (default: the first source)')
    load.add_argument('--mix', default=','.join(f'{kind}={weight}' for kind, weight in DEFAULT_MIX),
                      help='weights of single, bulk, bulk-rerank, rerank calls (default %(default)s)')
    load.add_argument('--bulk-rows', type=int, default=10, help='rows per bulk call (default 10)')
    load.add_argument('--drain-seconds', type=float, default=30.0,
                      help='time for calls in flight to finish after --seconds; then they are cancelled (30)')
    load.add_argument('--sample-ms', type=int, default=75, help='status sampling period, 50..1000 ms (75)')
    load.add_argument('--max-backoff', type=float, default=30.0, help='longest wait after a 429, s (30)')
    load.add_argument('--think-ms', type=int, default=200, help='pause between a user\'s calls: up to N ms')
    load.add_argument('--seed', type=int, help='random seed for the users\' choices')
    load.add_argument('--json', help='also write the report (every call) to this JSON file')
    handlers = {'match': _match, 'rerank': _rerank, 'sources': _sources, 'status': _status, 'load': _load}
    for command, handler in handlers.items():
        sub = commands.choices[command]
        sub.set_defaults(handler=handler, subparser=sub)
    return parser


def _read_rows(args, parser):
    try:
        if args.rows is not None:
            rows = parse_rows_arg(args.rows)
        elif args.rows_file is not None:
            rows = read_rows_file(args.rows_file)
        else:
            rows = demo_rows(args.demo_rows, seed=args.seed)
    except (OSError, ValueError) as ex:
        parser.error(str(ex))
    if not rows:
        parser.error('no rows')
    return rows


def _print_rows(report, out):
    rows = []
    for outcome in report.outcomes[:MAX_PRINTED_ROWS]:
        top = outcome.top or {}
        detail = ('{} {} ({})'.format(*candidate_fields(top)) if top else outcome.reason or '')
        rows.append([outcome.index, outcome.name[:50], str(outcome.status), detail[:90]])
    print(table(rows, ['#', 'row', 'status', 'top candidate / reason'], align='rlll'), file=out)
    if len(report.outcomes) > MAX_PRINTED_ROWS:
        print(f'... {len(report.outcomes) - MAX_PRINTED_ROWS} more rows: use --output FILE', file=out)


def _execute(run, args, label, out, err):
    try:
        report = run.execute()
        code = EXIT_OK if report.ok else EXIT_FAILED
    except errors.RunInterrupted as ex:
        report, code = ex.report, EXIT_INTERRUPTED
    if args.output:
        try:
            write_output(args.output, report)
            print(f'Wrote {len(report.outcomes)} rows to {args.output}', file=err)
        except OSError as ex:
            print(f'error: could not write {args.output}: {ex}', file=err)
            _print_rows(report, out)
            code = code if code != EXIT_OK else EXIT_FAILED
    else:
        _print_rows(report, out)
    print(format_summary(report, label=label), file=out)
    print(f'Run id: {run.run_id}', file=out)
    return code


def _run(args, parser, out, err, make_run):
    if not args.token:
        parser.error('give --token or set HEAVY_LANES_TOKEN')
    if args.max_concurrency < 1:
        parser.error('--max-concurrency must be at least 1')
    try:
        retry = RetryPolicy(max_attempts=args.max_attempts, max_wait_seconds=args.max_wait,
                            wait_paused=args.wait_paused)
    except ValueError as ex:
        parser.error(str(ex))
    poll = PollPolicy(long_poll_seconds=max(0, args.long_poll), task_timeout_seconds=args.task_timeout)
    timeout = (5.0, args.timeout)
    with Client(args.url, args.token, timeout=timeout, pool_size=args.max_concurrency + 4) as client:
        try:
            run = make_run(client, {'max_concurrency': args.max_concurrency, 'retry': retry, 'poll': poll,
                                        'run_id': args.run_id})
        except ValueError as ex:
            parser.error(str(ex))
        progress = None if args.no_progress else Progress(run.job.label, stream=err)
        run.progress = progress
        return _execute(run, args, run.job.label, out, err)


def _match(args, parser, out, err):
    rows = _read_rows(args, parser)
    return _run(args, parser, out, err, lambda client, options: Run.match(
        client, rows, args.source, semantic=args.semantic, reranker=args.reranker, limit=args.limit,
        batch_size=args.batch, **options))


def _rerank(args, parser, out, err):
    queries = list(args.q)
    if args.queries_file:
        try:
            with open(args.queries_file, encoding='utf-8') as handle:
                queries += [line.strip() for line in handle if line.strip()]
        except OSError as ex:
            parser.error(str(ex))
    if not queries:
        parser.error('give --q or --queries-file')
    rows = _read_rows(args, parser)
    return _run(args, parser, out, err, lambda client, options: Run.rerank(client, queries, rows, **options))


def _sources(args, parser, out, err):
    if not args.token:
        parser.error('give --token or set HEAVY_LANES_TOKEN')
    with Client(args.url, args.token, timeout=(5.0, args.timeout)) as client:
        sources = client.sources()
    rows = [[s.url, s.name, s.version or '', '' if s.concept_count is None else s.concept_count]
            for s in sources]
    text = table(rows, ['url', 'name', 'version', 'concepts'], align='lllr') if rows else 'No sources.'
    print(text, file=out)
    return EXIT_OK


def _status(args, parser, out, err):
    if not args.token:
        parser.error('give --token (a staff token) or set HEAVY_LANES_TOKEN')
    with Client(args.url, args.token, timeout=(5.0, args.timeout)) as client:
        print(json.dumps(client.capacity_status(), indent=2, sort_keys=True), file=out)
    return EXIT_OK


def _load(args, parser, out, err):
    try:
        accounts = read_accounts(args.tokens) if args.tokens else []
        accounts += [parse_token_arg(text) for text in args.token]
        plan = LoadPlan(url=args.url, accounts=tuple(accounts), users=args.users, seconds=args.seconds,
                        source=args.source, mix=parse_mix(args.mix), bulk_rows=args.bulk_rows,
                        staff_token=args.staff_token, sample_interval=args.sample_ms / 1000.0,
                        drain_seconds=args.drain_seconds, max_backoff=args.max_backoff,
                        think_seconds=args.think_ms / 1000.0, http_timeout=args.timeout, seed=args.seed)
    except (OSError, ValueError) as ex:
        parser.error(str(ex))
    print(f'load: {plan.users} users, {len(plan.accounts)} tokens, {plan.seconds:g} s '
          f'(+ up to {plan.drain_seconds:g} s to drain) against {plan.url}', file=err)
    try:
        report = LoadGenerator(plan).run()
    except ValueError as ex:
        print(f'error: {ex}', file=err)
        return EXIT_USAGE
    print(format_load_report(report), file=out)
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as handle:
            json.dump(asdict(report), handle, indent=2, default=str)
            handle.write('\n')
    if not report.ok:
        return EXIT_FAILED
    return EXIT_INTERRUPTED if report.interrupted else EXIT_OK


def main(argv=None, out=None, err=None):
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args, args.subparser, out, err)
    except KeyboardInterrupt:
        print('interrupted (again) while cancelling: some tasks may still run on the server', file=err)
        return EXIT_INTERRUPTED
    except ValueError as ex:  # a bad --url
        print(f'error: {ex}', file=err)
        return EXIT_USAGE
    except errors.ClientError as ex:  # sources / status
        print(f'error: {ex.reason}', file=err)
        return EXIT_FAILED
