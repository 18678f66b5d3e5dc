"""A Redis of our own on a free loopback port: `redis-server` without persistence, or the embedded server.

The embedded one is devstack.embedded_redis (fakeredis with Lua), for a machine without `redis-server`; it
needs fakeredis[lua] and lupa from requirements/dev.txt, which the production image doesn't install.
redis-py is imported only when a ping runs, so importing this module loads neither Django nor redis-py.
"""
import importlib.util
import shutil
import sys
import time
import urllib.parse

from devstack.processes import Child, free_port, stop_children, tail

EMBEDDED_NEEDS = ('fakeredis', 'lupa')  # requirements/dev.txt
START_SECONDS = 15


class RedisStartError(RuntimeError):
    """A Redis of our own could not start: not installed, exited, or no PONG in time."""


def server_binary():
    """The path of `redis-server`, or None when it isn't installed."""
    return shutil.which('redis-server')


def embedded_missing():
    """The module the embedded server needs but can't find, or None when it can run."""
    return next((name for name in EMBEDDED_NEEDS if importlib.util.find_spec(name) is None), None)


def server_argv(port, data_dir=None, binary=None):
    """redis-server on 127.0.0.1:`port`, in the foreground, logging to stdout, saving nothing."""
    argv = [binary or server_binary() or 'redis-server', '--port', str(port), '--bind', '127.0.0.1',
            '--save', '', '--appendonly', 'no']
    if data_dir is not None:
        argv += ['--dir', str(data_dir)]
    return argv + ['--daemonize', 'no', '--logfile', '']


def embedded_argv(port):
    return [sys.executable, '-m', 'devstack.embedded_redis', '--port', str(port)]


def url_of(port, db=0):
    return f'redis://127.0.0.1:{port}/{db}'


def masked(url):
    """A Redis URL with its password hidden, for printing."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f':{parts.password}@', ':***@', 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def ping(url, timeout=2.0):
    """Whether a Redis answers PING at `url` within `timeout` seconds."""
    import redis
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def wait_up(child, url, timeout=START_SECONDS, sleep=time.sleep):
    """Wait until the Redis that `child` runs answers at `url`: True, or False once the child exited or
    `timeout` seconds passed. `sleep` lets the launcher notice a Ctrl-C while it waits."""
    deadline = time.monotonic() + timeout
    while child.running() and time.monotonic() < deadline:
        if ping(url, timeout=0.5):
            return True
        sleep(0.05)
    return False


def start_redis(log_path, *, name='redis', embedded=False, port=None, data_dir=None, env=None,
                parent_pid=None, timeout=START_SECONDS):
    """Start a Redis of our own on `port` (default: a free one) and wait for it: (child, url).

    Raises RedisStartError when it can't, having stopped the child it started.
    """
    if embedded:
        missing = embedded_missing()
        if missing:
            raise RedisStartError(f'the embedded Redis needs {missing} (pip install -r requirements/dev.txt)')
        kind, binary = 'the embedded Redis', None
    else:
        binary = server_binary()
        if binary is None:
            raise RedisStartError('redis-server is not installed (apt-get install -y redis-server)')
        kind = 'redis-server'
    port = port or free_port()
    url = url_of(port)
    argv = embedded_argv(port) if embedded else server_argv(port, data_dir, binary)
    child = Child(name, argv, log_path).start(env, parent_pid)
    try:
        up = wait_up(child, url, timeout)
    except BaseException:
        stop_children([child])
        raise
    if not up:
        stop_children([child])
        raise RedisStartError(f'{kind} on port {port} did not start; the end of {log_path}:\n'
                              f'{tail(log_path)}')
    return child, url
