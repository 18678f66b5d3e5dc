"""A scrape of /metrics from a live stack (a real worker has run calls, so every series has samples) passes
`promtool check metrics`: Prometheus's own lint of names, types, units and help texts."""
import subprocess

import pytest

from tests.conftest import promtool
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import poll, submit

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_a_live_scrape_passes_promtool_check_metrics(start_worker, tiny_source, make_user, api_as, client):
    start_worker(queues=('es2_knn',))
    user = api_as(make_user('core_user'))
    ids = [submit(user, tiny_source).json()['id'] for _ in range(3)]  # one shadow-refused: a full lane
    for call_id in ids:
        assert poll(user, call_id).json()['state'] == 'succeeded'
    # A call's end is counted by its worker's Redis thread a moment after its row says so (capacity.counters).
    finished = 'heavy_lanes_calls_finished_total{queue="es2_knn",state="succeeded"} 3.0'
    wait_until(lambda: finished in client.get('/metrics').content.decode(), timeout=10, interval=0.2,
               message='the ends counted')
    scrape = client.get('/metrics')
    assert scrape.status_code == 200
    text = scrape.content.decode()
    for series in ('heavy_lanes_calls_finished_total{queue="es2_knn",state="succeeded"} 3.0',
                   'heavy_lanes_full_lanes_total', 'heavy_lanes_queue_pool_processes{queue="es2_knn"}'):
        assert series in text
    done = subprocess.run([promtool(), 'check', 'metrics'], input=text, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
