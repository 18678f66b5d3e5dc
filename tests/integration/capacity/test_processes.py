"""Whole processes: the limiter's two daemon threads must never hold up a process's exit for long.

Each test runs a small Python program (importing capacity.threads or capacity.logs only, no Django) in a
subprocess and stops it by its pid if it outlives its timeout.
"""
import contextlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def program(source, **popen):
    process = subprocess.Popen([sys.executable, '-c', textwrap.dedent(source)], cwd=ROOT, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(5)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def run(source, timeout=20):
    started = time.monotonic()
    with program(source, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f'the program was still running after {timeout} s')
        return process.returncode, stdout.decode(), stderr.decode(), time.monotonic() - started


def test_a_process_exits_at_once_while_a_redis_call_hangs(silent_server):
    # No socket timeout: the call would wait for the silent server forever.
    code, stdout, stderr, elapsed = run(f'''
        import time
        import redis
        from capacity.threads import RedisThread

        client = redis.Redis(port={silent_server.port}, socket_timeout=None, socket_connect_timeout=None)
        job = RedisThread().submit(client.ping)
        time.sleep(0.3)
        assert job.running(), 'the call should be hung'
        print('hung', flush=True)
    ''')
    assert (code, stdout, stderr) == (0, 'hung\n', '')
    assert silent_server.accepted.is_set()
    assert elapsed < 5


def test_a_process_prints_its_last_line_before_it_exits():
    # The writer is slowed down so that, without the drain at exit, the process would end before it wrote.
    code, stdout, stderr, _ = run('''
        import time
        from capacity import logs

        write = logs.LineSink.write
        logs.LineSink.write = lambda sink, line: (time.sleep(0.3), write(sink, line))
        logs.emit({'n': 1})
    ''')
    assert (code, stdout, stderr) == (0, '{"n":1}\n', '')


def test_a_blocked_stdout_holds_up_exit_at_most_the_drain_time():
    # stdout is a pipe nobody reads: once its 64 KiB buffer is full the writer blocks in write() for good.
    source = '''
        import sys
        from capacity import logs

        for n in range(40):
            logs.emit({'n': n, 'filler': 'x' * 5000})
        print('emitted', file=sys.stderr, flush=True)
    '''
    started = time.monotonic()
    with program(source, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        try:
            code = process.wait(20)  # without reading stdout, so it stays blocked
        except subprocess.TimeoutExpired:
            pytest.fail('a blocked stdout held the process up for 20 s')
        elapsed = time.monotonic() - started
        stderr = process.stderr.read().decode()
    assert (code, stderr) == (0, 'emitted\n')
    assert 2 <= elapsed < 5  # it waited DRAIN_SECONDS (2) for the lines, then left them


def test_a_forked_child_logs_through_its_own_sink():
    code, stdout, stderr, _ = run('''
        import os
        from capacity import logs

        logs.emit({'who': 'parent'})
        logs.drain()
        pid = os.fork()
        if pid == 0:
            logs.emit({'who': 'child'})
            logs.drain()
            os._exit(0)
        os.waitpid(pid, 0)
    ''')
    assert (code, stderr) == (0, '')
    assert stdout.splitlines() == ['{"who":"parent"}', '{"who":"child"}']
