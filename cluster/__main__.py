"""`python -m cluster` (`make cluster`): run the production shape on this machine, inject every fault under
load, and write the report (docs/cluster.md by default). Needs root (network namespaces), nginx,
redis-server with Sentinel, PostgreSQL's binaries and faketime.

    python -m cluster                       # every fault, report to docs/cluster.md
    python -m cluster --faults worker-host-killed,sentinel-kill-primary --report /tmp/c.md
    python -m cluster --short --report /tmp/c.md   # the short version `make test` runs (about a minute)
"""
import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

from cluster.faults import FAULTS, SHORT
from cluster.report import write


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m cluster')
    parser.add_argument('--faults', default=','.join(FAULTS), help='comma-separated, in order')
    parser.add_argument('--short', action='store_true',
                        help=f'{", ".join(SHORT)} only, with shorter spells of load before and after each')
    parser.add_argument('--report', default='docs/cluster.md')
    parser.add_argument('--keep', action='store_true', help="keep the run's directory (logs) afterwards")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit('The cluster harness needs root: it makes network namespaces.')
    faults = list(SHORT) if args.short else [name for name in args.faults.split(',') if name]
    unknown = [name for name in faults if name not in FAULTS]
    if unknown:
        sys.exit(f'Unknown faults {unknown}; the faults are {", ".join(FAULTS)}.')
    # A SIGTERM (a CI timeout, a kill by its pid) unwinds like Ctrl-C: every process stopped, every
    # namespace deleted (cluster.run's finally, cluster.net's atexit).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = tempfile.mkdtemp(prefix='hl-cluster-')
    os.chmod(workdir, 0o755)  # PostgreSQL runs as its own user under it
    from cluster.run import run
    started = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    try:
        outcomes, seconds, figures = run(workdir, faults,
                                         **({'warm': 5, 'after': 6, 'measure_cost': False, 'compare_floor': False}
                                            if args.short else {}))
    finally:
        if args.keep:
            print(f'logs kept in {workdir}/logs')
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    command = ('python -m cluster --short' if args.short else 'make cluster' if len(faults) == len(FAULTS)
               else f'python -m cluster --faults {",".join(faults)}')
    write(args.report, outcomes, seconds, command, started, figures)
    print(f'{sum(o.passed for o in outcomes)} of {len(outcomes)} faults passed every check in {seconds:.0f} s; '
          f'report: {args.report}')
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == '__main__':
    sys.exit(main())
