"""A private Heavy Lanes stack for the benchmarks, started and stopped by one object.

    with Stack(api_workers=3, lanes={'interactive': 1}) as stack:   # or stack.start() ... stack.stop()
        stack.url, stack.token('core'), stack.redis, stack.set_config(mode='enforce', ...)

What it starts, each child the leader of its own process group (logs in bench/out/stack/log/):
1. its own `redis-server` on a free loopback port, no persistence: the lanes, the broker and the cache;
2. its own PostgreSQL database (`heavy_lanes_bench` on 127.0.0.1:5432, trust auth, user postgres), dropped
   and created anew, then `migrate`, `load_terminology <name>`, `create_demo_users` (in a child process);
3. gunicorn `api.wsgi` with N gthread workers (api/gunicorn_config.py) on a free port (access log on, as in
   production); with `api_servers=2`, two such gunicorn servers, each on its own port and its own API host
   (CAPACITY_TASK_ID `api-a`, `api-b`: its own `api_heavy_task` lane and waiting cap), as two API machines
   behind a balancer would be;
4. one Celery worker per lane queue (`celery -A workers worker -Q <queue> -n <queue>@%h -P prefork -c 1`),
   whose pool the workers' own reconciler then sizes from the capacity config (`start()` returns once
   every pool has the size the config gives it, or the size `lanes` asks for); with `nodes_per_lane=2`,
   two per queue (`<queue>@a-%h`, `<queue>@b-%h`), over which the reconcilers split the lane's pool;
5. with `maintenance=True`, Celery beat and the maintenance worker as `make run` starts them
   (devstack.services), so the sweep (workers/sweep.py) runs every WORKERS_SWEEP_SECONDS (set it in `env`).

Settings are production-like where they matter for speed: DEBUG off, persistent database connections
(DATABASE_CONN_MAX_AGE=60, as docker-compose sets). Two are changed for the benchmarks and stated in
docs/benchmarks.md: the capacity config cache and the pool reconciler refresh every second (so a
benchmark's config change applies within 1.5 s; `config_seconds` gives a benchmark that changes no config
production's 10 s instead, bench/flood.py), and the heavy rate limit is `HEAVY_RATE_LIMIT` (default
here 100000/s: never throttles, while the per-user window (api.throttles) stays about as long as production's
600/min).
HEAVY_LANES_BENCH_VIEWS=true adds the floor views of api/bench_views.py under /bench/.

Warm results are off (`cache.ttl_seconds: 0`, in the config saved before anything starts) unless the
benchmark's own `config` sets `cache`: a benchmark that measures runs must not be answered from an earlier
identical call's result. Identical calls still coalesce while one is open (that has no switch), so a
benchmark that sends calls side by side makes each body distinct (`helpers.distinct`); `served_as()`
shows how the calls were served.

The match indexes are built once into bench/out/stack/var/indexes/ and reused while the terminology is
unchanged (they are keyed by its checksum). `stop()` stops the API and the workers, then Redis, and drops
the database; it runs from `with`, atexit, and on SIGTERM/SIGINT. One stack at a time (a lock file).

    .venv/bin/python bench/stack.py [--api-workers 3] [--terminology hpo]   # start, print, wait for Ctrl-C
    .venv/bin/python bench/stack.py --with-redis -- CMD ... {redis} ...      # CMD with a private Redis only
"""
import argparse
import atexit
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.helpers import lane_limits  # noqa: E402
from bench.stack_state import StackError, StackState  # noqa: E402
from devstack import services  # noqa: E402  (no Django)
from devstack.processes import Child, free_port, http_get, stop_children, tail  # noqa: E402  (no Django)
from devstack.redis_server import RedisStartError, start_redis  # noqa: E402
from workers.lanes import QUEUE_NAMES  # noqa: E402  (the queue table, no Django)

HOME = ROOT / 'bench' / 'out' / 'stack'
PG_ADMIN_URL = os.environ.get('BENCH_PG_ADMIN_URL', 'postgresql://postgres@127.0.0.1:5432/postgres')
DB_NAME = os.environ.get('BENCH_DB_NAME', 'heavy_lanes_bench')
SOURCES = {'hpo': '/orgs/HPO/sources/HPO/', 'tiny': '/orgs/HL/sources/TinyClinical/'}
NO_WARM_RESULTS = {'cache': {'ttl_seconds': 0}}  # a benchmark measures runs, not an earlier call's result
READY_SECONDS = 120
NODE_LETTERS = 'abcdefgh'  # the API servers' and a lane's worker nodes' names, in order
CONFIG_SECONDS = 1  # CAPACITY_CONFIG_CACHE_SECONDS and WORKERS_RECONCILE_SECONDS of the stack


def db_url(name=DB_NAME):
    return PG_ADMIN_URL.rsplit('/', 1)[0] + '/' + name


def _admin(sql):
    import psycopg
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as connection:
        connection.execute(sql)


class Stack(StackState):
    def __init__(self, api_workers=3, lanes=None, terminology='hpo', config=None, env=None,
                 bench_views=True, quiet=False, api_servers=1, nodes_per_lane=1, maintenance=False,
                 config_seconds=CONFIG_SECONDS):
        """`lanes`: {queue: pool size} of the lane workers to start (default: one worker per queue, pools
        from the default config); `config`: capacity config changes saved before anything starts, over
        NO_WARM_RESULTS (a `cache` key of its own replaces that); `api_servers`, `nodes_per_lane`,
        `maintenance`: see the module docstring (the defaults start one of each, no beat); `config_seconds`:
        the processes' CAPACITY_CONFIG_CACHE_SECONDS and WORKERS_RECONCILE_SECONDS (a benchmark that
        measures what production runs, not a config change, gives production's)."""
        self.config_seconds = config_seconds
        self.api_workers = api_workers
        self.api_servers = api_servers
        self.nodes_per_lane = nodes_per_lane
        self.maintenance = maintenance
        self.ports = []
        self.lanes = dict(lanes) if lanes is not None else dict.fromkeys(QUEUE_NAMES)
        self.terminology = terminology
        self.initial_config = {**NO_WARM_RESULTS, **(config or {})}
        self.extra_env = env or {}
        self.bench_views = bench_views
        self.quiet = quiet
        self.var = HOME / 'var'
        self.logs = HOME / 'log'
        self.children = {}
        self.env = None
        self.port = None
        self.redis_url = None
        self._redis = None
        self._lock = None
        self._db_created = False
        self._stopped = False
        self.timings = {}

    # --- public -------------------------------------------------------------------------------------------

    @property
    def url(self):
        return f'http://127.0.0.1:{self.port}'

    @property
    def urls(self):
        """Every API server's URL (one unless `api_servers`)."""
        return [f'http://127.0.0.1:{port}' for port in self.ports]

    def lane_children(self, queue):
        """The worker nodes (Child) of a lane queue: `worker-<queue>`, or `worker-<queue>-a`, `-b`, ..."""
        return [child for name, child in self.children.items()
                if name == f'worker-{queue}' or name.startswith(f'worker-{queue}-')]

    def node_names(self, queue):
        """The Celery node name (prefix before the host) of each node child of `queue`: {child name: prefix}."""
        if self.nodes_per_lane == 1:
            return {f'worker-{queue}': f'{queue}@'}
        return {f'worker-{queue}-{letter}': f'{queue}@{letter}-' for letter in NODE_LETTERS[:self.nodes_per_lane]}

    @property
    def source(self):
        return SOURCES[self.terminology]

    @property
    def redis(self):
        import redis
        if self._redis is None:
            self._redis = redis.Redis.from_url(self.redis_url)
        return self._redis

    def tokens(self):
        return json.loads((self.var / 'demo-tokens.json').read_text())

    def token(self, tier='core'):
        return next(row['token'] for row in self.tokens()['tokens'] if row['tier'] == tier)

    def say(self, message):
        if not self.quiet:
            print(f'[stack] {message}', flush=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        started = time.monotonic()
        self._take_lock()
        atexit.register(self.stop)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda number, frame: sys.exit(128 + number))
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            self._start_redis()
            self._prepare()
            self.django()
            self.set_config(wait=False, **self.initial_config)
            self._start_api()
            self._start_workers()
            if self.maintenance:
                self._start(services.maintenance_worker(self.logs))
                self._start(services.beat(self.logs, self.var))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.timings['start_seconds'] = round(time.monotonic() - started, 1)
        servers = f'{len(self.urls)} servers ' if len(self.urls) > 1 else ''
        self.say(f'ready in {self.timings["start_seconds"]} s: API {", ".join(self.urls)} ({servers}'
                 f'{self.api_workers} gthread workers each), '
                 f'Redis {self.redis_url}, database {DB_NAME}, lanes {self.pools()}')
        return self

    def stop(self):
        if self._stopped:
            return
        self._stopped = True
        others = [child for name, child in reversed(list(self.children.items())) if name != 'redis']
        stop_children(others)
        if 'redis' in self.children:
            stop_children([self.children['redis']])
        left = [child.name for child in self.children.values() if child.group_alive()]
        if left:
            print(f'[stack] could not stop: {", ".join(left)}', file=sys.stderr)
        if self._db_created:
            try:
                from django.db import connections
                connections.close_all()
            except Exception:  # noqa: BLE001 - Django may not be set up in this process
                pass
            try:
                _admin(f'DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)')
            except Exception as ex:  # noqa: BLE001
                print(f'[stack] could not drop {DB_NAME}: {ex}', file=sys.stderr)
        if self._lock is not None:
            self._lock.close()
        self.say('stopped')

    def django(self):
        """Set up Django in this process against the stack (same database, Redis and key prefix)."""
        import django
        os.environ.update(self.env)
        django.setup()

    def set_config(self, wait=True, note='benchmark', **changes):
        """Save capacity config changes (nested dicts); with `wait`, until every process has seen them."""
        from capacity.config import clear_cache, save_config
        save_config(changes, note=note)
        clear_cache()
        if wait:
            time.sleep(self.config_seconds + 0.5)

    # --- starting -----------------------------------------------------------------------------------------

    def _take_lock(self):
        HOME.mkdir(parents=True, exist_ok=True)
        lock = open(HOME / 'stack.lock', 'a+')  # noqa: SIM115 - held for the stack's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StackError(f'another benchmark stack is running ({HOME / "stack.lock"})') from None
        self._lock = lock

    def _start(self, child):
        self.children[child.name] = child
        child.start(self.env or dict(os.environ), os.getpid())
        return child

    def _start_redis(self):
        self.port = free_port()
        data = HOME / 'redis'
        data.mkdir(exist_ok=True)
        try:
            self.children['redis'], self.redis_url = start_redis(self.logs / 'redis.log', data_dir=data,
                                                                 parent_pid=os.getpid())
        except RedisStartError as ex:
            raise StackError(str(ex)) from None
        self.var.mkdir(parents=True, exist_ok=True)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(('CELERY_', 'CAPACITY_', 'REDIS_'))},
            'DJANGO_SETTINGS_MODULE': 'api.settings',
            'HEAVY_LANES_VAR_DIR': str(self.var),
            'DATABASE_URL': db_url(),
            'DATABASE_CONN_MAX_AGE': '60',
            'REDIS_URL': self.redis_url,
            'CELERY_BROKER_URL': self.redis_url,
            'DEBUG': 'false',
            'HEAVY_LANES_PRODUCTION': 'false',
            'CAPACITY_CONFIG_CACHE_SECONDS': str(self.config_seconds),
            'WORKERS_RECONCILE_SECONDS': str(self.config_seconds),
            'HEAVY_RATE_LIMIT': os.environ.get('HEAVY_RATE_LIMIT', '100000/s'),
            'HEAVY_LANES_BENCH_VIEWS': 'true' if self.bench_views else 'false',
            'PYTHONUNBUFFERED': '1',
            **self.extra_env,
        }

    def _prepare(self):
        started = time.monotonic()
        _admin(f'DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)')
        _admin(f'CREATE DATABASE {DB_NAME}')
        self._db_created = True
        python = sys.executable
        script = (
            'import django, time; django.setup()\n'
            'from django.core.management import call_command\n'
            f'for args in (["migrate", "--noinput", "-v", "0"], ["load_terminology", "{self.terminology}"],'
            ' ["create_demo_users"]):\n'
            '    t = time.monotonic(); call_command(*args)\n'
            '    print("---", args[0], round(time.monotonic() - t, 1), "s")\n'
            'from concepts.matching import store\n'
            'from concepts.models import Source\n'
            'from concepts.services import embedder_name\n'
            'for source in Source.objects.all():\n'
            '    store.lexical_index(source); store.semantic_index(source, embedder_name())\n'
        )
        child = self._start(Child('prepare', [python, '-c', script], self.logs / 'prepare.log'))
        child.process.wait()
        del self.children['prepare']
        if child.process.returncode != 0:
            raise StackError(f'preparing the database failed:\n{tail(child.log_path)}')
        self.timings['prepare_seconds'] = round(time.monotonic() - started, 1)
        self.say(f'database {DB_NAME} prepared in {self.timings["prepare_seconds"]} s '
                 f'({", ".join(line[4:] for line in tail(child.log_path, 10).splitlines() if line.startswith("---"))})')

    def _start_api(self):
        self.ports = [self.port] + [free_port() for _ in range(self.api_servers - 1)]
        for index, port in enumerate(self.ports):
            name = 'api' if index == 0 else f'api-{NODE_LETTERS[index]}'
            host = {'CAPACITY_TASK_ID': f'api-{NODE_LETTERS[index]}'} if self.api_servers > 1 else {}
            self._start(Child(name, [
                sys.executable, '-m', 'gunicorn', '-c', 'python:api.gunicorn_config', 'api.wsgi:application',
                '--bind', f'127.0.0.1:{port}', '--workers', str(self.api_workers), '--graceful-timeout', '5',
                '--access-logfile', str(self.logs / f'{name.replace("api", "access")}.log'), '--log-level', 'warning',
            ], self.logs / f'{name}.log', env=host,
                ready=lambda port=port: http_get(f'http://127.0.0.1:{port}/healthz')[0] == 200))

    def _start_workers(self):
        if any(size is not None for size in self.lanes.values()):
            self.set_config(wait=False, **lane_limits(self.lanes))
        for queue in self.lanes:
            for name, node in self.node_names(queue).items():
                log_path = self.logs / f'{name}.log'
                self._start(Child(name, [
                    sys.executable, '-m', 'celery', '-A', 'workers', 'worker', '-Q', queue, '-n', f'{node}%h',
                    '-P', 'prefork', '-c', '1', '-l', 'INFO', '--without-mingle', '--without-gossip',
                    '--include', 'api.bench_views',
                ], log_path, ready=lambda log_path=log_path: ' ready.' in tail(log_path, 400)))

    def _wait_ready(self):
        deadline = time.monotonic() + READY_SECONDS
        pending = [child for child in self.children.values() if child.name != 'redis']
        while pending:
            for child in self.children.values():
                if not child.running():
                    raise StackError(f'{child.name} exited ({child.process.returncode}):\n{tail(child.log_path)}')
            pending = [child for child in pending if not child.check_ready()]
            if time.monotonic() > deadline:
                raise StackError(f'not ready after {READY_SECONDS} s: {", ".join(c.name for c in pending)}')
            time.sleep(0.1)
        # Every pool at the size the config gives it: a worker starts with one process and its reconciler
        # grows it, and a benchmark that started before that measured the forks (new processes seconds
        # into bench/latency.py's run, calls queued behind them).
        from capacity.config import clear_cache, get_config
        from workers.lanes import pool_sizes
        clear_cache()
        sizes = pool_sizes(get_config())
        wanted = {queue: sizes[queue] if size is None else size for queue, size in self.lanes.items()
                  if size is not None or sizes[queue] > 0}
        if wanted:
            self.wait_pools(wanted, serving=True)


def with_redis(command):
    """Run `command` with `{redis}` replaced by the URL of a private redis-server; stop it after."""
    HOME.mkdir(parents=True, exist_ok=True)
    try:
        child, url = start_redis(HOME / 'redis-only.log', name='redis-only', parent_pid=os.getpid())
    except RedisStartError as ex:
        sys.exit(str(ex))
    try:
        argv = [part.replace('{redis}', url) for part in command]
        print('$', ' '.join(argv), flush=True)
        return subprocess.run(argv, check=False).returncode
    finally:
        stop_children([child])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--terminology', default='hpo', choices=sorted(SOURCES))
    parser.add_argument('--with-redis', action='store_true',
                        help='only start a private Redis and run the command after --, {redis} being its URL')
    parser.add_argument('command', nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.with_redis:
        command = args.command[1:] if args.command[:1] == ['--'] else args.command
        if not command:
            parser.error('--with-redis needs a command after --')
        sys.exit(with_redis(command))
    with Stack(api_workers=args.api_workers, terminology=args.terminology) as stack:
        print(json.dumps({'url': stack.url, 'redis': stack.redis_url, 'database': db_url(),
                          'source': stack.source, 'tokens': stack.tokens()}, indent=2))
        print('Ctrl-C stops it.')
        try:
            while all(child.running() for child in stack.children.values()):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == '__main__':
    main()
