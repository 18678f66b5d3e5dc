"""The production shape on one machine: each host a network namespace (cluster.net) with its own host name
(a UTS namespace, so Celery's `%h` names a node after its host, as in a container), running what
docker-compose.yml runs on it.

| host | runs |
|---|---|
| db | its own PostgreSQL instance (initdb into the run's directory) |
| redis1, redis2, redis3 | the Redis primary, its replica (redis2) and a Sentinel on each of the three |
| api1, api2 | gunicorn as compose runs it (`-c python:api.gunicorn_config`, production settings, 2 processes) |
| proxy | nginx, round robin over both API hosts (deploy/nginx.conf's upstream settings) |
| worker1, worker2 | one lane node per lane queue (interactive, es2_knn, api_heavy), prefork, as compose |
| ops | Celery beat, the maintenance worker, Flower |
| client | the load generator and the harness itself |

Every process is started through `devstack.processes.Child` (its own process group, output to a log file
in the run's directory) and stopped by its process group; `Cluster.stop()` stops them all.
"""
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster.net import Network
from devstack.processes import ROOT, Child, http_get, stop_children
from devstack.services import flower_argv

HOSTS = {'db': 2, 'redis1': 3, 'redis2': 4, 'redis3': 5, 'api1': 11, 'api2': 12, 'proxy': 20,
         'worker1': 21, 'worker2': 22, 'ops': 30, 'client': 40}
API_HOSTS = ('api1', 'api2')
WORKER_HOSTS = ('worker1', 'worker2')
LANE_QUEUES = ('interactive', 'es2_knn', 'api_heavy')
SENTINEL_HOSTS = ('redis1', 'redis2', 'redis3')
# Debian's PostgreSQL binaries (postgresql-NN), the newest installed.
PG_BIN = max(Path('/usr/lib/postgresql').glob('*/bin'), key=lambda path: int(path.parent.name),
             default=Path('/usr/lib/postgresql/15/bin'))
MASTER = 'mymaster'
SKEWED = Path(__file__).resolve().parent / 'skewed'  # the sitecustomize of a host whose clock is set ahead
SECRET = 'cluster-harness-not-a-real-secret-0123456789abcdef'
METRICS_TOKEN = 'cluster-metrics'
PYTHON = sys.executable

# Shorter than production's defaults so a fault's consequences play out within a minute (docs/cluster.md).
TIMING = {'WORKERS_RECONCILE_SECONDS': '2', 'WORKERS_SWEEP_SECONDS': '5', 'WORKERS_SWEEP_GRACE_SECONDS': '10',
          'CAPACITY_CONFIG_CACHE_SECONDS': '2'}


def wait_for(predicate, timeout, what, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f'timed out after {timeout} s waiting for {what}')


def libfaketime():
    """Debian's libfaketime (package faketime), which sets a host's clock ahead."""
    found = sorted(Path('/usr/lib').glob('*/faketime/libfaketime.so.1'))
    if not found:
        raise RuntimeError('libfaketime is missing: apt-get install -y faketime')
    return found[0]


class Cluster:
    def __init__(self, workdir):
        self.dir = Path(workdir)
        self.net = Network(HOSTS)
        self.children = {}  # (host, role) -> Child
        self.faketime = {}  # host -> offset (e.g. '+30s') for its next start

    # --- addresses and settings

    def addr(self, host):
        return self.net.address(host)

    @property
    def proxy_url(self):
        return f'http://{self.addr("proxy")}'

    def app_env(self, host):
        sentinels = ','.join(f'{self.addr(h)}:26379' for h in SENTINEL_HOSTS)
        env = {
            'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'LANG': 'C.UTF-8', 'PYTHONUNBUFFERED': '1',
            'DJANGO_SETTINGS_MODULE': 'api.settings', 'HEAVY_LANES_PRODUCTION': 'true', 'DEBUG': 'false',
            'SECRET_KEY': SECRET, 'METRICS_TOKEN': METRICS_TOKEN, 'FLOWER_BASIC_AUTH': 'ops:ops',
            'ALLOWED_HOSTS': ','.join([self.addr('proxy'), *(self.addr(h) for h in API_HOSTS),
                                       'localhost', '127.0.0.1']),
            'DATABASE_URL': f'postgres://postgres@{self.addr("db")}:5432/heavy_lanes',
            'DATABASE_CONN_MAX_AGE': '60',
            'REDIS_URL': f'redis://{self.addr("redis1")}:6379/0',
            'REDIS_SENTINELS': 'true', 'REDIS_SENTINELS_LIST': sentinels, 'REDIS_SENTINELS_MASTER': MASTER,
            'CAPACITY_LIMIT_MODE': 'enforce', 'HEAVY_LANES_VAR_DIR': str(self.dir / 'var'),
            'CONCEPTS_EMBEDDER': 'tfidf-svd', 'CONCEPTS_RERANKER': 'fuzzy', 'LOG_LEVEL': 'INFO',
            'MAX_MATCH_CANDIDATES': '40000', **TIMING,
        }
        if host in API_HOSTS:
            env['CAPACITY_TASK_ID'] = host
        return env

    # --- processes

    def _argv(self, host, argv):
        """`argv` run on `host`: in its network namespace, under its own host name, at its clock."""
        clock = self.faketime.get(host)
        if clock:
            # The wall clock only: a host whose clock is ahead still has a monotonic clock the kernel's
            # timed waits agree with (libfaketime would move both, and every timed wait would sleep the
            # offset longer). Its Python sleeps through cluster/skewed/sitecustomize.py (see there why).
            # The library is preloaded by `env`, which execs: the `faketime` command forks its program and
            # dies of a SIGTERM without passing it on, so a warm stop of the host became a SIGKILL.
            argv = ['env', f'LD_PRELOAD={libfaketime()}', f'FAKETIME={clock}', 'FAKETIME_DONT_FAKE_MONOTONIC=1',
                    f'PYTHONPATH={SKEWED}', *argv]
        return ['ip', 'netns', 'exec', self.net.namespace(host), 'unshare', '--uts', 'sh', '-c',
                f'hostname {host} && exec "$@"', 'sh', *argv]

    def start(self, host, role, argv, env=None, stop_signal=signal.SIGTERM):
        log = self.dir / 'logs' / f'{host}-{role}.log'
        if log.exists():  # a restart: the log of the process before is kept (the checks read it), as `.log.N`
            log.rename(log.with_name(f'{log.name}.{len(list(log.parent.glob(log.name + ".*"))) + 1}'))
        child = Child(f'{host}/{role}', self._argv(host, argv), log, stop_signal=stop_signal, cwd=ROOT)
        child.start({**(env if env is not None else self.app_env(host))})
        self.children[(host, role)] = child
        return child

    def on(self, host):
        return [child for (h, _role), child in self.children.items() if h == host]

    def kill_host(self, host):
        """Every process of the host SIGKILLed at once (a power cut, `docker kill` of all its containers)."""
        for child in self.on(host):
            child.signal_group(signal.SIGKILL)
        for child in self.on(host):
            child.kill()

    def stop_host(self, host, seconds=30):
        """Stop the host's services as `docker stop` does: the stop signal to each service's main process
        only (gunicorn's master, Celery's main process, which then stop their own children gracefully),
        SIGKILL for the groups after `seconds`."""
        children = [child for child in self.on(host) if child.running()]
        for child in children:
            try:
                os.kill(child.pid, child.stop_signal)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + seconds
        while any(child.running() for child in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop_children(children, seconds=0)

    def stop(self):
        """The app hosts first, then Redis and the database they use."""
        stores = [child for (host, _), child in self.children.items() if host == 'db' or host.startswith('redis')]
        stop_children([child for child in self.children.values() if child not in stores], seconds=10)
        stop_children(stores, seconds=10)

    def run(self, host, argv, env=None, timeout=120):
        """A one-shot command on `host`; its output, raising when it fails."""
        done = subprocess.run(self._argv(host, argv), cwd=ROOT, env=env if env is not None else self.app_env(host),
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f'{argv} on {host} failed ({done.returncode}):\n{done.stdout[-2000:]}'
                               f'\n{done.stderr[-2000:]}')
        return done.stdout

    # --- the database host

    def start_database(self, init=False):
        data = self.dir / 'pgdata'
        postgres = pwd.getpwnam('postgres')
        env = {'PATH': os.environ.get('PATH', ''), 'LANG': 'C.UTF-8'}
        # setpriv execs (runuser would stay as the parent and not pass SIGINT, the fast shutdown, on).
        as_postgres = ['setpriv', '--reuid=postgres', '--regid=postgres', '--init-groups']
        if init:
            data.mkdir()
            os.chown(data, postgres.pw_uid, postgres.pw_gid)
            self.run('db', [*as_postgres, str(PG_BIN / 'initdb'), '-D', str(data), '-A', 'trust', '-U', 'postgres',
                            '--no-sync'], env=env)
            with open(data / 'pg_hba.conf', 'a') as hba:
                hba.write(f'host all all {self.addr("db").rsplit(".", 1)[0]}.0/24 trust\n')
        self.start('db', 'postgres', [*as_postgres, str(PG_BIN / 'postgres'), '-D', str(data), '-c',
                                      f'listen_addresses={self.addr("db")}', '-c', f'unix_socket_directories={data}',
                                      '-c', 'fsync=off', '-c', 'max_connections=200'],
                   env=env, stop_signal=signal.SIGINT)
        wait_for(lambda: subprocess.run(self._argv('db', ['pg_isready', '-q', '-h', self.addr('db')]),
                                        capture_output=True).returncode == 0, 30, 'PostgreSQL')
        if init:
            self.run('db', ['createdb', '-h', self.addr('db'), '-U', 'postgres', 'heavy_lanes'], env=env)

    # --- Redis and its Sentinels

    def start_redis(self, host, replica_of=None):
        workdir = self.dir / host
        workdir.mkdir(exist_ok=True)
        argv = ['redis-server', '--bind', self.addr(host), '--port', '6379', '--protected-mode', 'no',
                '--save', '', '--appendonly', 'no', '--dir', str(workdir)]
        if replica_of:
            argv += ['--replicaof', self.addr(replica_of), '6379']
        self.start(host, 'redis', argv, env={'PATH': os.environ.get('PATH', '')})
        wait_for(lambda: self.redis_cli(host, 'PING') == 'PONG', 20, f'Redis on {host}')

    def start_sentinel(self, host, primary='redis1'):
        conf = self.dir / host / 'sentinel.conf'
        conf.parent.mkdir(exist_ok=True)
        if not conf.exists():
            conf.write_text('\n'.join([
                f'bind {self.addr(host)}', 'port 26379', 'protected-mode no', f'dir {conf.parent}',
                f'sentinel monitor {MASTER} {self.addr(primary)} 6379 2',
                f'sentinel down-after-milliseconds {MASTER} 2000',
                f'sentinel failover-timeout {MASTER} 10000',
                f'sentinel parallel-syncs {MASTER} 1', '']))
        self.start(host, 'sentinel', ['redis-server', str(conf), '--sentinel'],
                   env={'PATH': os.environ.get('PATH', '')})
        wait_for(lambda: self.redis_cli(host, 'PING', port=26379) == 'PONG', 20, f'Sentinel on {host}')

    def redis_cli(self, host, *command, port=6379, target=None):
        done = subprocess.run(self._argv('client', ['redis-cli', '-h', self.addr(target or host), '-p', str(port),
                                                    *command]), capture_output=True, text=True, timeout=10)
        return done.stdout.strip()

    def primary(self):
        """The host the Sentinels name as the primary now (asked of the first that answers)."""
        by_address = {self.addr(h): h for h in HOSTS}
        for sentinel in SENTINEL_HOSTS:
            answer = self.redis_cli(sentinel, 'SENTINEL', 'get-master-addr-by-name', MASTER, port=26379).split()
            if answer:
                return by_address.get(answer[0])
        return None

    # --- the API hosts and the proxy

    def start_api(self, host):
        self.start(host, 'gunicorn', [PYTHON, '-m', 'gunicorn', '-c', 'python:api.gunicorn_config',
                                      'api.wsgi:application', '--bind', '0.0.0.0:8000', '--forwarded-allow-ips=*'])

    def api_ready(self, host, path='/healthz'):
        return self.http(host, f'http://{self.addr(host)}:8000{path}')[0] == 200

    def http(self, host, url):
        """(status, body) of a GET from the client host (the harness runs there)."""
        return http_get(url, timeout=5)

    def start_proxy(self):
        conf = self.dir / 'nginx.conf'
        servers = '\n'.join(f'        server {self.addr(h)}:8000 max_fails=3 fail_timeout=10s;' for h in API_HOSTS)
        site = (ROOT / 'deploy' / 'nginx.conf').read_text()
        site = site.replace('listen 80;', f'listen {self.addr("proxy")}:80;')
        head, _, rest = site.partition('upstream heavy_lanes_api {')
        _, _, rest = rest.partition('keepalive 32;')
        site = head + 'upstream heavy_lanes_api {\n' + servers + '\n    keepalive 32;' + rest
        conf.write_text(f'daemon off;\nworker_processes 1;\npid {self.dir}/nginx.pid;\nerror_log {self.dir}/logs/'
                        f'nginx-error.log;\nevents {{ worker_connections 1024; }}\nhttp {{\n'
                        f'access_log off;\nclient_body_temp_path {self.dir}/nginx-body;\n'
                        f'proxy_temp_path {self.dir}/nginx-proxy;\n{site}\n}}\n')
        self.start('proxy', 'nginx', ['nginx', '-c', str(conf), '-e', f'{self.dir}/logs/nginx-error.log'],
                   env={'PATH': os.environ.get('PATH', '')}, stop_signal=signal.SIGQUIT)
        wait_for(lambda: http_get(self.proxy_url + '/healthz', timeout=2)[0] == 200, 30, 'nginx')

    # --- the worker hosts and the ops host

    def start_node(self, host, queue):
        self.start(host, queue, [PYTHON, '-m', 'celery', '-A', 'workers', 'worker', '-Q', queue, '-n',
                                 f'{queue}@%h', '-P', 'prefork', '-c', '1', '--without-gossip', '--without-mingle',
                                 '-l', 'INFO'])

    def start_workers(self, host):
        for queue in LANE_QUEUES:
            self.start_node(host, queue)

    def start_ops(self):
        self.start('ops', 'maintenance', [PYTHON, '-m', 'celery', '-A', 'workers', 'worker', '-Q', 'maintenance',
                                          '-n', 'maintenance@%h', '-P', 'solo', '--without-gossip', '--without-mingle',
                                          '-l', 'INFO'])
        self.start('ops', 'beat', [PYTHON, '-m', 'celery', '-A', 'workers', 'beat', '-l', 'INFO', '--schedule',
                                   str(self.dir / 'celerybeat-schedule')])
        self.start('ops', 'flower', [PYTHON, *flower_argv(5555, self.addr('ops'))[1:]])

    # --- the whole

    def up(self, prepare):
        """On the network made: the database, Redis, then `prepare()` (run in the harness: migrate, users,
        the source), then the app hosts."""
        (self.dir / 'logs').mkdir(parents=True, exist_ok=True)
        (self.dir / 'var').mkdir(exist_ok=True)
        self.start_database(init=True)
        self.start_redis('redis1')
        self.start_redis('redis2', replica_of='redis1')
        for host in SENTINEL_HOSTS:
            self.start_sentinel(host)
        prepare()
        for host in API_HOSTS:
            self.start_api(host)
        for host in WORKER_HOSTS:
            self.start_workers(host)
        self.start_ops()
        wait_for(lambda: all(self.api_ready(h) for h in API_HOSTS), 90, 'both API hosts')
        self.start_proxy()

    def down(self):
        try:
            self.stop()
        finally:
            self.net.remove()
            shutil.rmtree(self.dir / 'pgdata', ignore_errors=True)
