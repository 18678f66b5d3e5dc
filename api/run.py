"""`make run`: the whole service on one machine, in the foreground, with nothing left running after it.

    .venv/bin/python -m api.run        # PORT=8000 FLOWER_PORT=5555 REDIS_URL= HEAVY_LANES_VAR_DIR=var

1. Redis: the one at REDIS_URL when that is set; otherwise its own on a free port, `redis-server` when it is
   installed, else the embedded fakeredis server (api.embedded_redis). HEAVY_LANES_RUN_REDIS=server or
   =embedded picks one. REDIS_URL and CELERY_BROKER_URL (unless set) are exported to every child.
2. Prepares the database in a child process (`python -m api.run --prepare`): migrate, `load_terminology
   hpo`, `create_demo_users`. Each step is idempotent and quick the second time.
3. Starts, at once: the API (gunicorn api.wsgi, WEB_CONCURRENCY sync workers, default 3, on
   127.0.0.1:$PORT), one Celery worker per lane (`-Q <queue> -n <queue>@%h -P prefork -c 1`; each then
   sizes its own pool from the capacity config) and Flower (127.0.0.1:$FLOWER_PORT, basic auth), and
   waits until each is ready.
4. Prints the URLs, the demo tokens, Flower's credentials and an example client command; then watches,
   while a one-shot child builds the match indexes into VAR_DIR/indexes/ (once; later runs only load them).

Each child runs in its own process group (so a terminal's Ctrl-C reaches only this launcher) with its
output in VAR_DIR/log/<name>.log (the previous run's kept as <name>.log.1), and gets SIGTERM if the
launcher itself dies. SIGINT or SIGTERM stops everything: the API, Flower and the workers first, Redis
last, each group given STOP_SECONDS to exit before it is killed (a second Ctrl-C kills at once); any
process left in a child's group after its leader exited is killed too. If a child dies on its own, the
launcher prints the end of its log, stops the rest and exits 1.

Files in VAR_DIR: run.lock (one launcher per VAR_DIR), run.json (the launcher's and children's pids and
process groups while it runs), demo-tokens.json, flower-credentials.json, log/, redis/.
"""
import argparse
import base64
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
import urllib.parse
from pathlib import Path

from devstack.processes import Child, free_port, http_get, port_in_use, stop_children, tail

ROOT = Path(__file__).resolve().parent.parent
LANE_QUEUES = ('interactive', 'es2_knn', 'api_heavy')  # workers.lanes.LANES, without importing Django
READY_SECONDS = 90
TERMINOLOGY = 'hpo'
DEFAULT_SOURCE = '/orgs/HPO/sources/HPO/'


class Stop(Exception):
    """A stop was asked for (SIGINT/SIGTERM) or something failed: unwind and stop what was started."""

    def __init__(self, message='', code=0):
        super().__init__(message)
        self.code = code


def var_dir():
    return Path(os.environ.get('HEAVY_LANES_VAR_DIR') or ROOT / 'var').resolve()


def env_port(name, default):
    raw = os.environ.get(name) or str(default)
    try:
        port = int(raw)
    except ValueError:
        raise Stop(f'{name}={raw!r} is not a port number.', 2) from None
    if not 0 < port < 65536:
        raise Stop(f'{name}={port} is not a port number.', 2)
    return port


def read_private(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_private(path, document):
    temporary = path.with_name(f'.{path.name}.tmp')
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, 'w') as handle:
        json.dump(document, handle, indent=2)
        handle.write('\n')
    os.replace(temporary, path)


def masked(url):
    """A Redis URL with its password hidden, for printing."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f':{parts.password}@', ':***@', 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class Launcher:
    def __init__(self, out=sys.stdout):
        self.out = out
        self.var = var_dir()
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
            self.start_services()
            self.wait_ready()
            self.banner()
            self.warm_indexes()
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
        lock = open(self.var / 'run.lock', 'a+')  # noqa: SIM115 - held (flock) for the whole run
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            other = (read_private(self.var / 'run.json') or {}).get('launcher', '?')
            raise Stop(f'Another `make run` (pid {other}) is using {self.var}; stop it first, or set '
                       f'HEAVY_LANES_VAR_DIR to another directory.', 1) from None
        self.lock = lock

    def release_lock(self):
        if self.lock is not None:
            try:
                (self.var / 'run.json').unlink()
            except FileNotFoundError:
                pass
            self.lock.close()

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
        write_private(self.var / 'run.json', {
            'launcher': os.getpid(),
            'var_dir': str(self.var),
            'redis_url': masked(self.redis_url),
            'children': {name: {'pid': child.pid, 'pgid': child.pid, 'log': str(child.log_path)}
                         for name, child in self.children.items()},
        })

    # --- Redis ----------------------------------------------------------------------------------------------

    def start_redis(self):
        if os.environ.get('REDIS_URL'):
            self.redis_url = os.environ['REDIS_URL']
            self.redis_kind = 'REDIS_URL'
            if not self.ping(self.redis_url):
                raise Stop(f'No Redis answers at REDIS_URL={masked(self.redis_url)}.', 1)
            self.env = self.child_env()
            return
        wanted = (os.environ.get('HEAVY_LANES_RUN_REDIS') or 'auto').strip().lower()
        if wanted not in ('auto', 'server', 'embedded'):
            raise Stop(f'HEAVY_LANES_RUN_REDIS={wanted!r}: use auto, server or embedded.', 2)
        server = shutil.which('redis-server')
        if wanted == 'server' and not server:
            raise Stop('HEAVY_LANES_RUN_REDIS=server but redis-server is not installed '
                       '(apt-get install -y redis-server).', 1)
        use_server = bool(server) and wanted != 'embedded'
        data_dir = self.var / 'redis'
        data_dir.mkdir(exist_ok=True)
        for _attempt in range(3):  # a free port can be taken between choosing it and binding it
            port = free_port()
            if use_server:
                self.redis_kind = 'redis-server'
                argv = [server, '--port', str(port), '--bind', '127.0.0.1', '--save', '',
                        '--appendonly', 'no', '--dir', str(data_dir), '--daemonize', 'no', '--logfile', '']
            else:
                self.redis_kind = 'embedded fakeredis'
                argv = [sys.executable, '-m', 'api.embedded_redis', '--port', str(port)]
            self.redis_url = f'redis://127.0.0.1:{port}/0'
            redis = self.start(Child('redis', argv, self.logs / 'redis.log'))
            deadline = time.monotonic() + 15
            while redis.running() and time.monotonic() < deadline:
                if self.ping(self.redis_url, timeout=0.5):
                    self.env = self.child_env()
                    self.say(f'Redis ({self.redis_kind}) on 127.0.0.1:{port}')
                    return
                self.sleep(0.05)
            self.stop_children([redis])
            del self.children['redis']
        log_path = self.logs / 'redis.log'
        raise Stop(f'Redis did not start; the end of {log_path}:\n{tail(log_path)}', 1)

    @staticmethod
    def ping(url, timeout=2.0):
        import redis
        try:
            client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError):
            return False

    # --- database -------------------------------------------------------------------------------------------

    def prepare(self):
        started = time.monotonic()
        self.say(f'Preparing the database: migrate, load_terminology {TERMINOLOGY}, create_demo_users '
                 f'(log: {self.logs / "setup.log"})')
        child = self.start(Child('setup', [sys.executable, '-m', 'api.run', '--prepare'],
                                 self.logs / 'setup.log'))
        while child.running():
            self.sleep(0.05)
        if child.process.returncode != 0:
            raise Stop(f'Preparing the database failed (exit {child.process.returncode}); the end of '
                       f'{child.log_path}:\n{tail(child.log_path)}', 1)
        del self.children['setup']
        self.write_pids()
        self.say(f'  done in {time.monotonic() - started:.1f} s')

    # --- services -------------------------------------------------------------------------------------------

    def flower_credentials(self):
        """'user:password' for Flower: FLOWER_BASIC_AUTH when set, else generated once into VAR_DIR."""
        if os.environ.get('FLOWER_BASIC_AUTH'):
            return os.environ['FLOWER_BASIC_AUTH'].split(',')[0]
        path = self.var / 'flower-credentials.json'
        saved = read_private(path)
        if not (saved and saved.get('username') and saved.get('password')):
            saved = {'username': 'admin', 'password': secrets.token_urlsafe(18)}
            write_private(path, saved)
        return f'{saved["username"]}:{saved["password"]}'

    def start_services(self):
        python = sys.executable
        api_workers = os.environ.get('WEB_CONCURRENCY') or '3'
        # A call with `Prefer: wait=N` holds a sync worker up to wait.max_seconds (at most 120 s).
        self.start(Child('api', [
            python, '-m', 'gunicorn', 'api.wsgi:application', '--bind', f'127.0.0.1:{self.port}',
            '--workers', api_workers, '--worker-class', 'sync', '--timeout', '150', '--graceful-timeout', '5',
            '--access-logfile', '-', '--error-logfile', '-', '--log-level', 'info',
        ], self.logs / 'api.log', ready=lambda: http_get(f'{self.api_url}/healthz')[0] == 200))
        for queue in LANE_QUEUES:
            log_path = self.logs / f'worker-{queue}.log'
            self.start(Child(f'worker-{queue}', [
                python, '-m', 'celery', '-A', 'workers', 'worker', '-Q', queue, '-n', f'{queue}@%h',
                '-P', 'prefork', '-c', '1', '-l', 'INFO',
            ], log_path, ready=lambda log_path=log_path: ' ready.' in tail(log_path, 200)))
        self.flower_auth = self.flower_credentials()
        # Flower reads FLOWER_BASIC_AUTH as --basic_auth; in the environment the password stays out of `ps`.
        flower_auth = os.environ.get('FLOWER_BASIC_AUTH') or self.flower_auth
        self.start(Child('flower', [
            python, '-m', 'celery', '-A', 'workers', 'flower', f'--port={self.flower_port}',
            '--address=127.0.0.1',
        ], self.logs / 'flower.log', env={'FLOWER_BASIC_AUTH': flower_auth}, ready=lambda: http_get(
            f'{self.flower_url}/api/workers', {'Authorization': self.flower_header})[0] == 200))

    @property
    def api_url(self):
        return f'http://127.0.0.1:{self.port}'

    @property
    def flower_url(self):
        return f'http://127.0.0.1:{self.flower_port}'

    @property
    def flower_header(self):
        return 'Basic ' + base64.b64encode(self.flower_auth.encode()).decode()

    def wait_ready(self):
        deadline = time.monotonic() + READY_SECONDS
        pending = [child for child in self.children.values() if child.name != 'redis']
        while pending:
            self.check_children()
            pending = [child for child in pending if not child.check_ready()]
            if not pending:
                # Flower inspected the workers when it started, maybe before they were up: ask it again.
                http_get(f'{self.flower_url}/api/workers?refresh=1', {'Authorization': self.flower_header},
                         timeout=5)
                return
            if time.monotonic() > deadline:
                child = pending[0]
                names = ', '.join(c.name for c in pending)
                raise Stop(f'{names} not ready after {READY_SECONDS} s; the end of {child.log_path}:\n'
                           f'{tail(child.log_path)}', 1)
            self.sleep(0.1)

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

    def warm_indexes(self):
        """Build (first run) or check (later runs) the match indexes in the background, so the first heavy
        call doesn't spend ~20 s building the semantic index; a call that comes first waits on the same
        build (concepts.matching.store builds each index once, under a file lock)."""
        self.start(Child('indexes', [sys.executable, '-m', 'api.run', '--build-indexes'],
                         self.logs / 'indexes.log', one_shot=True))

    def watch(self):
        while True:
            self.check_children()
            self.sleep(0.5)

    # --- what to print --------------------------------------------------------------------------------------

    def source(self, token):
        """(url, description) of the loaded HPO source, read back through GET /sources/."""
        status, body = http_get(f'{self.api_url}/sources/', {'Authorization': f'Token {token}'}, timeout=5)
        if status == 200:
            try:
                sources = json.loads(body)
                chosen = next((s for s in sources if s.get('mnemonic') == 'HPO'),
                              sources[0] if sources else None)
            except (ValueError, AttributeError, TypeError):
                chosen = None
            if chosen:
                return chosen['url'], (f'{chosen.get("name")} version {chosen.get("version")}, '
                                       f'{chosen.get("concept_count")} concepts')
        return DEFAULT_SOURCE, f'(GET /sources/ answered {status or "nothing"}; assumed)'

    def banner(self):
        tokens = read_private(self.var / 'demo-tokens.json') or {'tokens': []}
        by_tier = {row['tier']: row for row in tokens['tokens']}
        core = by_tier.get('core', {}).get('token', '<token>')
        source_url, source_text = self.source(core)
        user, password = self.flower_auth.split(':', 1)
        hostname = socket.gethostname()
        say = self.say
        say()
        seconds = time.monotonic() - self.started
        say(f'Heavy Lanes is running (ready in {seconds:.1f} s). Ctrl-C stops everything.')
        say()
        say(f'  API       {self.api_url}/            health {self.api_url}/healthz')
        say(f'  Schema    {self.api_url}/schema/')
        say(f'  Sources   {self.api_url}/sources/    {source_url}  {source_text}')
        say(f'  Flower    {self.flower_url}/    user {user}  password {password}')
        say(f'  Redis     {masked(self.redis_url)}  ({self.redis_kind})')
        say(f'  Workers   {", ".join(f"{queue}@{hostname}" for queue in LANE_QUEUES)} '
            f'(pools sized from the capacity config)')
        say(f'  Logs      {self.logs}/')
        say()
        say(f'Demo users (tokens also in {self.var / "demo-tokens.json"}):')
        for row in tokens['tokens']:
            say(f'  {row["username"]:<13} {row["tier"]:<13} {row["token"]}')
        say()
        say('Try:')
        say(f'  curl -H "Authorization: Token {core}" {self.api_url}/sources/')
        say(f'  .venv/bin/python -m heavy_lanes_client match --url {self.api_url} --token {core} '
            f'--source {source_url} --semantic --demo-rows 50')
        say(f'  .venv/bin/python -m heavy_lanes_client load --url {self.api_url} '
            f'--tokens {self.var / "demo-tokens.json"} --staff-token {tokens.get("staff_token", "<token>")} '
            f'--seconds 30')
        say()

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


def _exit_on_sigterm():
    """Let SIGTERM unwind (finally blocks, the index store's temporary directories) instead of killing."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def prepare():
    """The database steps, run in a child of the launcher: migrate, load the terminology, demo users."""
    import django
    from django.core.management import call_command

    _exit_on_sigterm()
    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
    django.setup()
    for label, args in (('migrate', ['migrate', '--noinput']),
                        (f'load_terminology {TERMINOLOGY}', ['load_terminology', TERMINOLOGY]),
                        ('create_demo_users', ['create_demo_users'])):
        started = time.monotonic()
        print(f'--- {label}', flush=True)
        call_command(*args)
        print(f'--- {label}: {time.monotonic() - started:.1f} s', flush=True)
    return 0


def build_indexes():
    """The lexical and semantic index of every loaded source: built once into VAR_DIR, loaded later."""
    import django

    _exit_on_sigterm()
    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
    django.setup()
    from concepts.matching import store
    from concepts.models import Source
    from concepts.services import embedder_name

    started = time.monotonic()
    built = []
    for source in Source.objects.all():
        store.lexical_index(source)
        store.semantic_index(source, embedder_name())
        built.append(source.url)
    print(f'match indexes of {", ".join(built) or "no source"} ready in {time.monotonic() - started:.1f} s',
          flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m api.run', description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--prepare', action='store_true',
                        help='only migrate, load the terminology and create the demo users, then exit')
    parser.add_argument('--build-indexes', action='store_true',
                        help='only build (or load) the match indexes of the loaded sources, then exit')
    args = parser.parse_args(argv)
    if args.prepare:
        return prepare()
    if args.build_indexes:
        return build_indexes()
    try:
        launcher = Launcher()
    except Stop as stop:
        print(stop, file=sys.stderr)
        return stop.code
    return launcher.run()


if __name__ == '__main__':
    sys.exit(main())
