"""True queue depth: the message of a call cancelled while queued no longer counts in its queue's depth or
age, in status and in /metrics."""
import time

import pytest
from django.utils import timezone

from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_operations import scrape
from tests.integration.workers.test_queue import submit
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_a_cancelled_call_on_a_paused_lane_no_longer_counts_in_depth_or_age(
        broker, tiny_source, make_user, api_as, configure, lanes_redis, client):
    configure(es2_knn=1)  # paused
    staff = api_as(make_user(is_staff=True))
    user = api_as(make_user())
    ids = []
    for _ in range(3):
        ids.append(submit(user, tiny_source).json()['id'])
        time.sleep(0.5)
    assert staff.get('/capacity/status/').json()['queues']['es2_knn']['depth'] == 3

    assert user.delete(f'/tasks/{ids[0]}/').status_code == 200  # the oldest

    queue = staff.get('/capacity/status/').json()['queues']['es2_knn']
    oldest_live = (timezone.now() - Work.objects.get(pk=ids[1]).created_at).total_seconds()
    assert queue['depth'] == 2
    assert abs(queue['oldest_waiting_seconds'] - oldest_live) < 0.3
    metrics = scrape(client)
    assert metrics['heavy_lanes_queue_depth{queue="es2_knn"}'] == 2
    assert abs(metrics['heavy_lanes_queue_oldest_waiting_seconds{queue="es2_knn"}'] - oldest_live) < 0.5
    wait_until(lambda: scrape(client).get(
        'heavy_lanes_calls_finished_total{queue="es2_knn",state="cancelled"}') == 1, timeout=5,
        message='the cancel to be counted')
