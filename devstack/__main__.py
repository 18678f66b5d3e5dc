"""python -m devstack: what `make run` runs (see devstack.launcher); --prepare and --build-indexes are the
one-shot steps it starts in children of their own."""
import argparse
import sys

from devstack import launcher
from devstack.prepare import build_indexes, prepare


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m devstack', description=launcher.__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--prepare', action='store_true',
                        help='only migrate, load the terminology, create the demo users and collect the static '
                             'files, then exit')
    parser.add_argument('--build-indexes', action='store_true',
                        help='only build (or load) the match indexes of the loaded sources, then exit')
    args = parser.parse_args(argv)
    if args.prepare:
        return prepare()
    if args.build_indexes:
        return build_indexes()
    try:
        run = launcher.Launcher()
    except launcher.Stop as stop:
        print(stop, file=sys.stderr)
        return stop.code
    return run.run()


if __name__ == '__main__':
    sys.exit(main())
