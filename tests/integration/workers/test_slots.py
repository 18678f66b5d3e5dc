"""The slot keeper of a node's main process (workers.slots): it renews the leases and beats the row of each
work a live pool process of this node runs, and nothing else."""
import os
from unittest import mock

import pytest

from tests.integration.workers.test_execution import admitted, keys, now_ms
from workers import lifecycle, slots
from workers.models import Work

pytestmark = pytest.mark.django_db
NODE = 'es2_knn@host'


def keeper_with(held):
    return mock.patch.object(slots, 'held_slots', return_value=held)


def test_a_running_work_of_a_live_pool_process_is_renewed_and_beaten(make_user, lanes, configure):
    configure(lease_seconds=60, renew_seconds=20)
    work = admitted(make_user())
    pid = os.getpid()  # a process that exists
    lifecycle.start(work, f'{NODE} pid {pid}')
    for key in keys(work):
        lanes.zadd(key, {work.pk: now_ms(lanes) + 1000})  # about to expire
    Work.objects.filter(pk=work.pk).update(heartbeat_at=None)
    with keeper_with({work.pk: pid}):
        assert slots.SlotKeeper(NODE).turn() == 1
    assert all(lanes.zscore(key, work.pk) > now_ms(lanes) + 50_000 for key in keys(work))
    assert Work.objects.get(pk=work.pk).heartbeat_at is not None


@pytest.mark.parametrize('case', ['gone process', 'another node', 'another process', 'ended'])
def test_nothing_else_is_kept(make_user, lanes, configure, case):
    configure(lease_seconds=60, renew_seconds=20)
    work = admitted(make_user())
    pid = os.getpid()
    runner = {'another node': f'other@host pid {pid}', 'another process': f'{NODE} pid 1'}.get(
        case, f'{NODE} pid {pid}')
    lifecycle.start(work, runner)
    if case == 'ended':
        lifecycle.fail(Work.objects.get(pk=work.pk), 'boom')
    for key in keys(work):
        lanes.zadd(key, {work.pk: now_ms(lanes) + 1000})
    held = {work.pk: 2 ** 22 + 1 if case == 'gone process' else pid}  # pids never reach 2**22 + 1
    with keeper_with(held):
        assert slots.SlotKeeper(NODE).turn() == 0
    assert all(lanes.zscore(key, work.pk) <= now_ms(lanes) + 1000 for key in keys(work))


def test_held_slots_reads_the_lane_calls_the_pool_runs():
    from celery.worker import state

    from workers.celery import TASK_NAME
    ours = mock.Mock(id='a', worker_pid=11)
    ours.name = TASK_NAME
    other = mock.Mock(id='b', worker_pid=12)
    other.name = 'heavy_lanes.sweep'
    not_accepted = mock.Mock(id='c', worker_pid=None)
    not_accepted.name = TASK_NAME
    with mock.patch.object(state, 'active_requests', {ours, other, not_accepted}):
        assert slots.held_slots() == {'a': 11}
