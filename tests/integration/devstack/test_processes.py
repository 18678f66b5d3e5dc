"""devstack.processes with real processes: what make run, bench/ and the fixtures rely on to leave nothing
running. Every process a test starts is SIGKILLed by its process group at the end, pass or fail."""
import os
import signal
import sys
import time

import pytest

from devstack.processes import Child, kill_groups, live_members, pgid_of, stop_children

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

# Ignores SIGTERM, and so does the process it leaves in its group (SIG_IGN is inherited).
DEAF = '''
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
print('ready', flush=True)
time.sleep(300)
'''
# Exits on SIGTERM, but leaves a process in its group that ignores it (a pool process, say).
LEAVES_ONE = '''
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
                  'print("ready", flush=True); time.sleep(300)'])
time.sleep(300)
'''
# Starts a child tied to itself (parent_pid) and prints the child's pid.
PARENT = '''
import os, sys, time
from devstack.processes import Child
child = Child('orphan', [sys.executable, '-c', 'import time; time.sleep(300)'], sys.argv[1])
print(child.start(parent_pid=os.getpid()).pid, flush=True)
time.sleep(300)
'''


def wait_for(predicate, timeout=10, message='condition'):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f'timed out after {timeout} s waiting for {message}')


@pytest.fixture
def groups():
    """Process groups to SIGKILL at teardown."""
    seen = set()
    yield seen
    kill_groups(seen)


def start_two(tmp_path, groups, name, source):
    child = Child(name, [sys.executable, '-c', source], tmp_path / f'{name}.log').start()
    groups.add(child.pid)
    wait_for(lambda: 'ready' in child.output() and len(live_members({child.pid})) == 2,
             message='both processes')
    return child


def test_a_child_deaf_to_sigterm_is_killed_with_its_group_after_the_grace_period(tmp_path, groups):
    child = start_two(tmp_path, groups, 'deaf', DEAF)
    said = []
    started = time.monotonic()
    stop_children([child], seconds=0.5, say=said.append)
    assert said == ['deaf did not stop in 0.5 s: killed.']
    assert not child.running()
    assert live_members({child.pid}) == []
    assert time.monotonic() - started < 5


def test_what_a_stopped_child_leaves_in_its_group_is_killed(tmp_path, groups):
    child = start_two(tmp_path, groups, 'leaves-one', LEAVES_ONE)
    said = []
    stop_children([child], seconds=5, say=said.append)
    assert said == []  # the leader itself stopped on SIGTERM
    assert child.process.returncode == -signal.SIGTERM
    assert live_members({child.pid}) == []


def test_a_child_tied_to_its_parent_gets_sigterm_when_the_parent_is_killed(tmp_path, groups):
    parent = Child('parent', [sys.executable, '-c', PARENT, str(tmp_path / 'orphan.log')],
                   tmp_path / 'parent.log').start()
    groups.add(parent.pid)
    orphan = int(wait_for(lambda: parent.output().strip(), message='the child pid'))
    groups.add(orphan)
    assert pgid_of(orphan) == orphan  # the leader of a group of its own, not in its parent's
    os.kill(parent.pid, signal.SIGKILL)
    parent.process.wait(5)
    wait_for(lambda: pgid_of(orphan) is None, timeout=5, message='the orphan to exit')


def test_a_restarted_child_keeps_the_previous_run_log(tmp_path):
    log = tmp_path / 'echo.log'
    for word in ('first', 'second'):
        child = Child('echo', ['echo', word], log).start()
        child.process.wait(10)
    assert log.read_text() == 'second\n'
    assert (tmp_path / 'echo.log.1').read_text() == 'first\n'
