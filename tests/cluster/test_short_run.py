"""The cluster harness's short version (cluster/, `python -m cluster --short`): the production shape on this
machine — PostgreSQL, Redis behind three Sentinels, two gunicorn API hosts behind nginx, two worker hosts,
beat, the maintenance worker and Flower, each in its own network namespace — with a worker host killed
whole and the Redis primary SIGKILLed under load. Every check of the report must pass, each must fail on
its fault's data with a violation planted in it, and nothing the run started (a process, a namespace) may
be left behind. Needs root; locally a skip, in CI a failure."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing_service
from tests.integration.workers.conftest import ROOT

pytestmark = [pytest.mark.slow]
TOOLS = ('ip', 'nginx', 'redis-server', 'faketime', 'setpriv', 'unshare')


def namespaces():
    listed = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout.split('\n')
    return sorted(line.split()[0] for line in listed if line.startswith('hl-'))


@pytest.mark.timeout(150)
def test_a_killed_worker_host_and_a_redis_failover_lose_nothing(tmp_path):
    if os.geteuid() != 0:
        missing_service('the cluster harness needs root (network namespaces)')
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing or not list(Path('/usr/lib/postgresql').glob('*/bin/postgres')):
        missing_service(f'the cluster harness needs {missing or "PostgreSQL"} (.ci/run installs them)')
    assert not namespaces(), 'a cluster run is already going on here'
    report = tmp_path / 'cluster.md'
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(('DJANGO_', 'HEAVY_LANES_', 'REDIS_', 'CELERY_', 'CAPACITY_', 'DATABASE_'))}
    log = tmp_path / 'run.log'
    with open(log, 'w') as out:
        run = subprocess.Popen([sys.executable, '-m', 'cluster', '--short', '--report', str(report)], cwd=ROOT,
                               env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = run.wait(120)
        except subprocess.TimeoutExpired:
            run.terminate()  # the harness stops what it started and deletes its namespaces
            run.wait(60)
            code = 'timeout'
    text = report.read_text() if report.exists() else ''
    assert code == 0, f'{log.read_text()[-6000:]}\n{text}'
    assert text.count('PASS') >= 16 and 'FAIL' not in text, text  # 2 faults x 8 checks
    # each fault's own data judged again with an overlap, a lane over and a /readyz 503 planted: all caught
    assert text.count(', caught') == 6 and 'missed' not in text, text
    assert not namespaces()
