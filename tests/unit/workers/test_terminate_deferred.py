"""A SIGTERM that meets a run in its end is taken once the end is whole (workers.execution)."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    import django
    django.setup()
    from capacity import logs
    from workers.execution import terminate_deferred
    with terminate_deferred() as ending:
        os.kill(os.getpid(), signal.SIGTERM)  # the cancel's signal, in the middle of the end
        time.sleep(0.05)
        logs.emit({'event': 'ended', 'mode': sys.argv[1]})  # queued for the writer thread
        print('end whole', flush=True)
    print('never here', flush=True)
''')


def run(mode):
    env = {**os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings', 'PYTHONPATH': str(ROOT)}
    return subprocess.run([sys.executable, '-c', SCRIPT, mode], capture_output=True, text=True, env=env,
                          timeout=60, cwd=ROOT)


def test_the_end_completes_its_line_is_written_then_the_signal_is_taken():
    done = run('held')
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert 'end whole' in done.stdout
    assert '"event":"ended"' in done.stdout  # written out before the process took the signal
    assert 'never here' not in done.stdout
