"""Child processes, each the leader of its own process group, and the small helpers around them.

Shared by `make run` (devstack.launcher), the benchmarks (bench/stack.py) and the tests that start real
processes. A Child writes its output to a log file (the previous run's kept as <log>.1), reads stdin from
/dev/null and, given its parent's pid, is sent SIGTERM by the kernel when that parent dies, even by SIGKILL
(PR_SET_PDEATHSIG). stop_children() stops by process group: each child's stop signal, a grace period, then
SIGKILL, then SIGKILL again for anything left in the groups (a pool process, a gunicorn worker).

Standard library only (no Django, no redis-py), so anything can import it.
"""
import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository; children run there
STOP_SECONDS = 10  # grace period of a stop; a worker's warm shutdown waits for its running call up to this
LEFTOVER_SECONDS = 5  # how long to keep killing what is left in a group after its leader exited
TAIL_LINES = 30
PR_SET_PDEATHSIG = 1


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it before you bind)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def port_in_use(port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(('127.0.0.1', port))
        except OSError:
            return True
    return False


def http_get(url, headers=None, timeout=2.0):
    """(status, body bytes) of a GET; status 0 when nothing answered."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as ex:
        return ex.code, b''
    except (OSError, ValueError):
        return 0, b''


def tail(path, lines=TAIL_LINES):
    """The last `lines` lines of a log file ('' when it can't be read)."""
    try:
        with open(path, errors='replace') as handle:
            return ''.join(deque(handle, maxlen=lines))
    except OSError:
        return ''


def pids():
    """Every process id in /proc."""
    return [int(entry) for entry in os.listdir('/proc') if entry.isdigit()]


def pgid_of(pid):
    """The process group of a live (not zombie) process, or None."""
    try:
        with open(f'/proc/{pid}/stat') as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ('Z', 'X') else int(fields[2])


def live_members(pgids):
    """Pids of the live (not zombie) processes in any of the process groups `pgids`."""
    pgids = set(pgids)
    return [pid for pid in pids() if pgid_of(pid) in pgids]


def kill_groups(pgids):
    """SIGKILL every process group in `pgids`; a group already gone is skipped."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def die_with_parent(parent_pid):
    """A preexec_fn: the child gets SIGTERM when `parent_pid` dies without stopping it (even by SIGKILL).

    libc is looked up here, before the fork, so the child only makes the one prctl call. Like any
    preexec_fn, only for a parent without other threads.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):
        prctl = None

    def setup():
        if prctl is None:
            return
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os.kill(os.getpid(), signal.SIGTERM)
    return setup


class Child:
    """One process started by us, the leader of its own process group (its pid is the group's id)."""

    def __init__(self, name, argv, log_path, *, ready=None, env=None, one_shot=False,
                 stop_signal=signal.SIGTERM, cwd=ROOT):
        self.name = name
        self.one_shot = one_shot  # expected to exit on its own (the launcher's index warm-up)
        self.argv = argv
        self.log_path = Path(log_path)
        self.extra_env = env or {}  # on top of the environment given to start(); kept out of argv (`ps`)
        self.ready = ready or (lambda: True)  # () -> bool, polled until True
        self.stop_signal = stop_signal
        self.cwd = cwd
        self.process = None
        self.is_ready = False

    def start(self, env=None, parent_pid=None):
        """Start it with `env` (default: ours) plus its own variables. With `parent_pid`, it gets SIGTERM
        when that process dies (see die_with_parent); leave it None in a process that runs threads."""
        if self.log_path.exists():
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + '.1'))
        preexec = None if parent_pid is None else die_with_parent(parent_pid)
        with open(self.log_path, 'wb') as log:
            self.process = subprocess.Popen(
                self.argv, cwd=self.cwd, env={**(os.environ if env is None else env), **self.extra_env},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, process_group=0,
                preexec_fn=preexec)  # noqa: PLW1509 - see die_with_parent
        return self

    @property
    def pid(self):
        return self.process.pid

    def running(self):
        return self.process is not None and self.process.poll() is None

    def output(self):
        """Everything it logged so far."""
        try:
            return self.log_path.read_text(errors='replace')
        except OSError:
            return ''

    def signal_group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self):
        """Whether any process is left in this child's group (its pool processes, gunicorn's workers)."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return any(pgid_of(pid) == self.pid for pid in pids())

    def check_ready(self):
        if not self.is_ready and self.running():
            self.is_ready = bool(self.ready())
        return self.is_ready

    def stop(self, seconds=STOP_SECONDS):
        """Stop its whole group (see stop_children)."""
        stop_children([self], seconds)

    def kill(self):
        """SIGKILL its whole group at once, then whatever is left in it."""
        if self.process is None:
            return
        self.signal_group(signal.SIGKILL)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass
        kill_leftovers([self])


def stop_children(children, seconds=STOP_SECONDS, say=None, hurry=lambda: False):
    """Stop each child's process group: its stop signal, `seconds` to exit, then SIGKILL, and then
    SIGKILL for anything left in the groups (a pool process, a gunicorn worker). `say` reports a kill;
    once `hurry()` is true (a second Ctrl-C) nothing waits and nothing is reported."""
    for child in children:
        if child.running():
            child.signal_group(child.stop_signal)
    deadline = time.monotonic() + seconds
    while any(child.running() for child in children) and time.monotonic() < deadline and not hurry():
        time.sleep(0.05)
    for child in children:
        if child.running():
            if say is not None and not hurry():
                say(f'{child.name} did not stop in {seconds} s: killed.')
            child.signal_group(signal.SIGKILL)
            try:
                child.process.wait(5)
            except subprocess.TimeoutExpired:
                pass
    kill_leftovers(children)


def kill_leftovers(children, seconds=LEFTOVER_SECONDS):
    """SIGKILL what is left in the children's groups until they are empty or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    for child in children:
        if child.process is None:
            continue
        while child.group_alive() and time.monotonic() < deadline:
            child.signal_group(signal.SIGKILL)
            time.sleep(0.05)
