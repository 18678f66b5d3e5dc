"""`make run`: the whole service on one machine, in the foreground, with nothing left running after it.

    .venv/bin/python -m devstack        # PORT=8000 FLOWER_PORT=5555 REDIS_URL= HEAVY_LANES_VAR_DIR=var

1. Redis: the one at REDIS_URL when that is set; otherwise its own on a free port, `redis-server` when it is
   installed, else the embedded fakeredis server (devstack.embedded_redis). HEAVY_LANES_RUN_REDIS=server or
   =embedded picks one. REDIS_URL and CELERY_BROKER_URL (unless set) are exported to every child.
2. Prepares the database in a child process (`python -m devstack --prepare`): migrate, `load_terminology
   hpo`, `create_demo_users`, `collectstatic` into VAR_DIR/static/ (the API serves only what it gathered),
   the lexical indexes (BM25: seconds). Each step is idempotent and quick the second time. It notes in
   VAR_DIR/setup.json the sources whose semantic index isn't built yet.
3. Starts, at once: the API (gunicorn api.wsgi, api/gunicorn_config.py's 2 gthread processes,
   127.0.0.1:$PORT), Celery beat and the maintenance worker that runs the sweep and retention it sends,
   Flower (127.0.0.1:$FLOWER_PORT, basic auth), and, when every semantic index is built, one Celery worker
   per lane queue (`-Q <queue> -n <queue>@%h -P prefork -c 1`; each then sizes its own pool from the
   capacity config). Waits until each is ready.
4. Prints the URLs, the demo tokens, Flower's credentials and an example client command; then watches.
5. On a first start, after the banner: builds the semantic indexes in a one-shot child (`python -m devstack
   --build-indexes`: the sentence model over every name, synonym and definition, then the adapter's fit;
   its progress every 10 s in VAR_DIR/log/indexes.log and on /capacity/status/ under `indexes`), and starts
   the lane workers once it ended. Until then the API accepts heavy calls and they wait in their queues
   (up to their queue deadline): a lane worker loads the built indexes before its pool forks
   (workers.signals.warm_indexes), so its pool processes share them, and no call builds one beside the
   build or waits for it holding a pool process. Should the build fail, the lane workers start anyway and
   the first call that needs the index builds it (once, under the index's lock).

Each child runs in its own process group (so a terminal's Ctrl-C reaches only this launcher) with its
output in VAR_DIR/log/<name>.log (the previous run's kept as <name>.log.1), and gets SIGTERM if the
launcher itself dies. SIGINT or SIGTERM stops everything: the API, Flower and the workers first, Redis
last, each group given STOP_SECONDS to exit before it is killed (a second Ctrl-C kills at once); any
process left in a child's group after its leader exited is killed too. If a child dies on its own, the
launcher prints the end of its log, stops the rest and exits 1.

Files in VAR_DIR: run.lock (one launcher per VAR_DIR), run.json (the launcher's and children's pids and
process groups while it runs), setup.json, demo-tokens.json, flower-credentials.json, log/, redis/, indexes/,
static/ (and static-sources.sha256, what it was collected from).
"""
import os
import signal
import sys
import time

from devstack import files, redis_server, services
from devstack.banner import banner
from devstack.prepare import TERMINOLOGY, semantic_missing
from devstack.processes import Child, free_port, http_get, port_in_use, stop_children, tail

READY_SECONDS = 90
REDIS_ATTEMPTS = 3  # a free port can be taken between choosing it and binding it


class Stop(Exception):
    """A stop was asked for (SIGINT/SIGTERM) or something failed: unwind and stop what was started."""

    def __init__(self, message='', code=0):
        super().__init__(message)
        self.code = code


def env_port(name, default):
    raw = os.environ.get(name) or str(default)
    try:
        port = int(raw)
    except ValueError:
        raise Stop(f'{name}={raw!r} is not a port number.', 2) from None
    if not 0 < port < 65536:
        raise Stop(f'{name}={port} is not a port number.', 2)
    return port


class Launcher:
    def __init__(self, out=sys.stdout):
        self.out = out
        self.var = files.var_dir()
        self.logs = self.var / 'log'
        self.port = env_port('PORT', 8000)
        self.flower_port = env_port('FLOWER_PORT', 5555)
        self.children = {}  # name -> Child, in start order
        self.stopping = False
        self.hurry = False
        self.stop_asked = None
        self.started = time.monotonic()
        self.lock = None
        self.env = None
        self.redis_url = None
        self.redis_kind = None
        self.flower_auth = None
        self.building = []  # source urls whose semantic index the first start builds after its banner
        self.lanes_started = False

    @property
    def api_url(self):
        return f'http://127.0.0.1:{self.port}'

    @property
    def flower_url(self):
        return f'http://127.0.0.1:{self.flower_port}'

    # --- output and signals ---------------------------------------------------------------------------------

    def say(self, message=''):
        try:
            print(message, file=self.out, flush=True)
        except OSError:  # the terminal went away (SIGHUP): keep stopping what was started regardless
            pass

    def on_signal(self, signum, frame):
        name = signal.Signals(signum).name
        if self.stopping:
            if not self.hurry:
                self.hurry = True
                self.say(f'{name} again: killing what is left.')
            return
        self.stop_asked = name

    def check(self):
        """Raise Stop when a signal asked for it; called from every wait loop."""
        if self.stop_asked and not self.stopping:
            raise Stop(f'{self.stop_asked}: stopping.')

    def sleep(self, seconds):
        self.check()
        time.sleep(seconds)
        self.check()

    # --- the run --------------------------------------------------------------------------------------------

    def run(self):
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGHUP, self.on_signal)
        code = 0
        try:
            self.take_lock()
            self.check_ports()
            self.start_redis()
            self.prepare()
            self.wait_ready(self.start_services())
            for line in banner(var=self.var, logs=self.logs, api_url=self.api_url, flower_url=self.flower_url,
                               flower_auth=self.flower_auth, redis_url=self.redis_url,
                               redis_kind=self.redis_kind, seconds=time.monotonic() - self.started,
                               building=self.building):
                self.say(line)
            if self.building:
                self.start(services.index_step(self.logs))
            self.watch()
        except Stop as stop:
            if str(stop):
                self.say(str(stop))
            code = stop.code
        finally:
            self.stop_all()
            self.release_lock()
        return code

    def take_lock(self):
        self.var.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.lock = files.lock_run(self.var)
        if self.lock is None:
            raise Stop(f'Another `make run` (pid {files.holder(self.var)}) is using {self.var}; stop it '
                       f'first, or set HEAVY_LANES_VAR_DIR to another directory.', 1)

    def release_lock(self):
        if self.lock is not None:
            files.unlock_run(self.var, self.lock)

    def check_ports(self):
        for name, port in (('PORT', self.port), ('FLOWER_PORT', self.flower_port)):
            if port_in_use(port):
                raise Stop(f'Port {port} on 127.0.0.1 is in use; set {name} to a free port.', 1)
        if self.port == self.flower_port:
            raise Stop('PORT and FLOWER_PORT must differ.', 1)

    def child_env(self):
        env = dict(os.environ)
        env.update({
            'HEAVY_LANES_VAR_DIR': str(self.var),
            'REDIS_URL': self.redis_url,
            'CELERY_BROKER_URL': os.environ.get('CELERY_BROKER_URL') or self.redis_url,
            'PYTHONUNBUFFERED': '1',
        })
        env.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
        env.pop('FLOWER_UNAUTHENTICATED_API', None)  # Flower's API stays behind its basic auth
        return env

    def start(self, child):
        self.children[child.name] = child
        child.start(self.env or dict(os.environ), os.getpid())
        self.write_pids()
        return child

    def write_pids(self):
        files.write_run(self.var, redis_server.masked(self.redis_url), self.children)

    # --- Redis ----------------------------------------------------------------------------------------------

    def start_redis(self):
        if os.environ.get('REDIS_URL'):
            self.redis_url = os.environ['REDIS_URL']
            self.redis_kind = 'REDIS_URL'
            if not redis_server.ping(self.redis_url):
                raise Stop(f'No Redis answers at REDIS_URL={redis_server.masked(self.redis_url)}.', 1)
            self.env = self.child_env()
            return
        wanted = (os.environ.get('HEAVY_LANES_RUN_REDIS') or 'auto').strip().lower()
        if wanted not in ('auto', 'server', 'embedded'):
            raise Stop(f'HEAVY_LANES_RUN_REDIS={wanted!r}: use auto, server or embedded.', 2)
        server = redis_server.server_binary()
        if wanted == 'server' and not server:
            raise Stop('HEAVY_LANES_RUN_REDIS=server but redis-server is not installed '
                       '(apt-get install -y redis-server).', 1)
        use_server = bool(server) and wanted != 'embedded'
        missing = None if use_server else redis_server.embedded_missing()
        if missing:
            raise Stop(f'The embedded Redis needs {missing}, from requirements/dev.txt (make run installs '
                       f'it); or install redis-server (apt-get install -y redis-server), or set REDIS_URL.', 1)
        self.redis_kind = 'redis-server' if use_server else 'embedded fakeredis'
        data_dir = self.var / 'redis'
        data_dir.mkdir(exist_ok=True)
        log_path = self.logs / 'redis.log'
        for _attempt in range(REDIS_ATTEMPTS):
            port = free_port()
            argv = (redis_server.server_argv(port, data_dir, server) if use_server
                    else redis_server.embedded_argv(port))
            self.redis_url = redis_server.url_of(port)
            redis = self.start(Child('redis', argv, log_path))
            if redis_server.wait_up(redis, self.redis_url, sleep=self.sleep):
                self.env = self.child_env()
                self.say(f'Redis ({self.redis_kind}) on 127.0.0.1:{port}')
                return
            self.stop_children([redis])
            del self.children['redis']
        raise Stop(f'Redis did not start; the end of {log_path}:\n{tail(log_path)}', 1)

    # --- database and services ------------------------------------------------------------------------------

    def prepare(self):
        started = time.monotonic()
        self.say(f'Preparing the database: migrate, load_terminology {TERMINOLOGY}, create_demo_users, '
                 f'collectstatic, the lexical indexes (log: {self.logs / "setup.log"})')
        child = self.start(services.prepare_step(self.logs))
        while child.running():
            self.sleep(0.05)
        if child.process.returncode != 0:
            raise Stop(f'Preparing the database failed (exit {child.process.returncode}); the end of '
                       f'{child.log_path}:\n{tail(child.log_path)}', 1)
        del self.children['setup']
        self.write_pids()
        self.say(f'  done in {time.monotonic() - started:.1f} s')
        missing = semantic_missing(self.var)
        self.building = list(missing) if missing is not None else []

    def start_services(self):
        """Start the API, the maintenance worker, beat and Flower, and the lane workers unless a semantic index
        is to be built first; the children started."""
        started = [self.start(services.api(self.port, self.logs)),
                   self.start(services.maintenance_worker(self.logs)),
                   self.start(services.beat(self.logs, self.var))]
        self.flower_auth = services.flower_credentials(self.var)
        started.append(self.start(services.flower(self.flower_port, self.logs, self.flower_auth)))
        if not self.building:
            started += self.start_lane_workers()
        return started

    def start_lane_workers(self):
        """The lane workers: each loads the built match indexes before its pool forks
        (workers.signals.warm_indexes), so its pool processes share them and no call builds or loads one.
        Started beside the build, they found nothing to load and the first semantic call took ~4.6 s."""
        self.lanes_started = True
        return [self.start(worker) for worker in services.lane_workers(self.logs)]

    def wait_ready(self, children):
        """Wait until each of `children` is ready (READY_SECONDS), then have Flower look at the workers."""
        deadline = time.monotonic() + READY_SECONDS
        pending = list(children)
        while pending:
            self.check_children()
            pending = [child for child in pending if not child.check_ready()]
            if pending and time.monotonic() > deadline:
                names = ', '.join(child.name for child in pending)
                raise Stop(f'{names} not ready after {READY_SECONDS} s; the end of {pending[0].log_path}:\n'
                           f'{tail(pending[0].log_path)}', 1)
            if pending:
                self.sleep(0.1)
        # Flower inspected the workers when it started, maybe before they were up: ask it again.
        http_get(f'{self.flower_url}/api/workers?refresh=1',
                 {'Authorization': services.basic_header(self.flower_auth)}, timeout=5)

    def check_children(self):
        for child in list(self.children.values()):
            if child.one_shot and not child.running():
                self.one_shot_done(child)
            elif not child.running():
                raise Stop(f'\n{child.name} exited unexpectedly (exit {child.process.returncode}); the end '
                           f'of {child.log_path}:\n{tail(child.log_path)}', 1)

    def one_shot_done(self, child):
        del self.children[child.name]
        self.write_pids()
        if child.process.returncode == 0:
            self.say(f'{child.name}: done ({tail(child.log_path, 1).strip()})')
        else:
            self.say(f'{child.name} failed (exit {child.process.returncode}); calls build what they need '
                     f'themselves. The end of {child.log_path}:\n{tail(child.log_path)}')

    def watch(self):
        while True:
            self.check_children()
            if self.building and not self.lanes_started and 'indexes' not in self.children:
                self.wait_ready(self.start_lane_workers())
                self.say(f'Lane workers ready {time.monotonic() - self.started:.1f} s after the start: the '
                         'queued calls run now.')
            self.sleep(0.5)

    # --- stopping -------------------------------------------------------------------------------------------

    def stop_all(self):
        self.stopping = True
        if not self.children:
            return
        started = time.monotonic()
        self.say('Stopping ...')
        others = [child for name, child in reversed(list(self.children.items())) if name != 'redis']
        self.stop_children(others)
        if 'redis' in self.children:  # last: the workers and Flower talk to it while they shut down
            self.stop_children([self.children['redis']])
        left = [child.name for child in self.children.values() if child.group_alive()]
        if left:
            self.say(f'Could not stop: {", ".join(left)}')
        else:
            self.say(f'Stopped everything in {time.monotonic() - started:.1f} s.')

    def stop_children(self, children):
        stop_children(children, say=self.say, hurry=lambda: self.hurry)
