"""The sweep, on the real broker: calls past their deadline end `expired` unpolled, and calls whose message
went missing are sent again (and run once); a live worker's call never is."""
import json
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from tests.integration.workers.test_queue import holds, poll, submit
from workers import messages, sweep
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def lose_messages(broker, queue):
    """What a Redis that lost its data (or a publish that never landed) leaves: no message for the queue."""
    for name in messages.lists(queue):
        broker.delete(name)


def test_a_queued_call_past_its_deadline_is_expired_by_the_sweep_without_a_poll(
        broker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)  # paused: nothing takes the message
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    assert messages.depth('es2_knn') == 1 and holds(lanes_redis, call_id) > 0
    Work.objects.filter(pk=call_id).update(expires_at=timezone.now() - timedelta(seconds=1))

    report = sweep.sweep()

    assert report.expired == [call_id]
    call = Work.objects.get(pk=call_id)
    assert call.state == 'expired' and call.started_at is None
    assert holds(lanes_redis, call_id) == 0
    assert messages.depth('es2_knn') == 0  # its message is off the broker too


def test_a_queued_call_whose_message_was_lost_is_sent_again_and_runs(
        broker, start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)
    start_worker(name='knn', queues=('es2_knn',))
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    fresh = sweep.sweep(grace_seconds=60)
    assert fresh.resent == []  # younger than the grace period: left alone
    lose_messages(broker, 'es2_knn')
    assert sweep.sweep(grace_seconds=60).resent == []  # still inside the grace period

    report = sweep.sweep(grace_seconds=0)

    assert report.resent == [call_id]
    assert call_id in messages.present(['es2_knn'])
    assert sweep.sweep(grace_seconds=0).resent == []  # it has a message now
    configure(es2_knn=3)  # resume the lane: the message sent again runs the call, once
    assert poll(client, call_id, timeout=30).json()['state'] == 'succeeded'
    assert Work.objects.get(pk=call_id).attempts == 1


def test_a_running_call_whose_worker_is_gone_is_sent_again_even_when_its_dead_node_holds_its_message(
        broker, tiny_source, make_user, api_as, configure, lanes_redis):
    """A node killed whole leaves its call's message unacknowledged; the broker would deliver it again only
    after its visibility timeout (an hour), and then discard it as past its queue deadline. The sweep takes
    that entry off `unacked` and sends the message again once the work's heartbeat is stale."""
    configure(es2_knn=1)
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    # A worker took it (its message is unacknowledged) and died: no heartbeat for longer than a lease.
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix']
    raw = next(broker.rpop(name) for name in messages.lists('es2_knn') if broker.llen(name))
    broker.hset(prefix + 'unacked', 'tag-1', json.dumps([json.loads(raw), '', 'es2_knn']))
    broker.zadd(prefix + 'unacked_index', {'tag-1': time.time() - 100})
    stale = timezone.now() - timedelta(seconds=120)
    Work.objects.filter(pk=call_id).update(state='running', worker='gone@host pid 1', started_at=stale,
                                           heartbeat_at=stale)

    assert sweep.sweep(grace_seconds=0).resent == [call_id]
    assert not broker.hexists(prefix + 'unacked', 'tag-1')  # never restored by the broker an hour later
    assert messages.depth('es2_knn') == 1
    assert sweep.sweep(grace_seconds=0).resent == []  # it has a message now
    Work.objects.filter(pk=call_id).update(heartbeat_at=timezone.now())
    lose_messages(broker, 'es2_knn')
    assert sweep.sweep(grace_seconds=0).resent == []  # a live worker's call is never sent again


def test_a_running_call_with_a_dead_worker_past_its_queue_deadline_is_taken_over_and_ends(
        broker, start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    # Its message sent again by the sweep must not expire at the queue deadline (a worker discards an
    # expired message unread): the call would stay `running` on nobody, sent again every sweep.
    configure(es2_knn=1)  # paused: nothing takes the first message
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    lose_messages(broker, 'es2_knn')  # its worker took it and died, and the broker lost it
    past = timezone.now() - timedelta(seconds=120)
    Work.objects.filter(pk=call_id).update(state='running', worker='gone@host pid 1', started_at=past,
                                                heartbeat_at=past, expires_at=past, attempts=1)

    assert sweep.sweep(grace_seconds=0).resent == [call_id]
    raw = next(raw for name in messages.lists('es2_knn') for raw in broker.lrange(name, 0, -1))
    assert json.loads(raw)['headers']['expires'] is None
    start_worker(name='knn', queues=('es2_knn',))
    configure(es2_knn=3)
    assert poll(client, call_id, timeout=30).json()['state'] == 'succeeded'
    assert Work.objects.get(pk=call_id).attempts == 2  # taken over


def take(broker, queue, tag, seconds_ago, eta=None):
    """What a worker that took the queue's message `seconds_ago` and never acknowledged it leaves (kombu's
    QoS.append): the message off its list, into `unacked` and its index. `eta`: the message is a retry
    with a countdown, held by the worker until then."""
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix']
    raw = next(broker.rpop(name) for name in messages.lists(queue) if broker.llen(name))
    message = json.loads(raw)
    if eta is not None:
        message['headers']['eta'] = eta.isoformat()
    broker.hset(prefix + 'unacked', tag, json.dumps([message, '', queue]))
    broker.zadd(prefix + 'unacked_index', {tag: time.time() - seconds_ago})


def test_a_queued_call_whose_delivery_a_worker_lost_is_sent_again_and_the_lost_entry_dropped(
        broker, start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)  # paused: no worker takes the message but ours
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    Work.objects.filter(pk=call_id).update(created_at=timezone.now() - timedelta(seconds=120))
    take(broker, 'es2_knn', 'tag-1', seconds_ago=5)
    assert messages.snapshot(['es2_knn']).held == [messages.Held(call_id, 'tag-1', pytest.approx(time.time() - 5,
                                                                                               abs=1))]

    assert sweep.sweep(grace_seconds=60).resent == []  # taken only just now: its worker is about to start it
    report = sweep.sweep(grace_seconds=2)  # taken, and not started, for longer than the grace period

    assert report.resent == [call_id]
    found = messages.snapshot(['es2_knn'])
    assert found.waiting == {call_id} and found.held == []  # sent again; kombu won't deliver the lost one
    assert sweep.sweep(grace_seconds=2).resent == []
    start_worker(name='knn', queues=('es2_knn',))
    configure(es2_knn=3)
    assert poll(client, call_id, timeout=30).json()['state'] == 'succeeded'
    assert Work.objects.get(pk=call_id).attempts == 1


def test_a_held_message_of_a_running_call_is_left_and_one_of_an_ended_call_dropped(
        broker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)
    client = api_as(make_user())
    running, ended = (submit(client, tiny_source).json()['id'] for _ in range(2))
    take(broker, 'es2_knn', 'tag-r', seconds_ago=600)
    take(broker, 'es2_knn', 'tag-e', seconds_ago=600)
    by_tag = {held.tag: held.call_id for held in messages.snapshot(['es2_knn']).held}
    Work.objects.filter(pk=by_tag['tag-r']).update(state='running', worker='knn@host pid 1',
                                                        started_at=timezone.now(), heartbeat_at=timezone.now())
    assert client.delete(f"/tasks/{by_tag['tag-e']}/").json()['state'] == 'cancelled'
    fresh = messages.Held(by_tag['tag-e'], 'tag-e', time.time())

    assert sweep.sweep(grace_seconds=60).discarded == 1  # the ended call's entry, taken 10 min ago
    assert [held.call_id for held in messages.snapshot(['es2_knn']).held] == [by_tag['tag-r']]
    assert messages.drop_held(fresh) is False  # gone already: a late acknowledgement removes nothing
    assert {running, ended} == set(by_tag.values())


def test_a_queued_call_whose_message_a_worker_holds_for_its_eta_is_left_alone(
        broker, tiny_source, make_user, api_as, configure, lanes_redis):
    # A retry with a countdown (the database was down at its start): the worker holds it until its ETA.
    configure(es2_knn=1)
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    Work.objects.filter(pk=call_id).update(created_at=timezone.now() - timedelta(seconds=120))
    take(broker, 'es2_knn', 'tag-1', seconds_ago=100, eta=timezone.now() + timedelta(seconds=20))

    assert sweep.sweep(grace_seconds=2).resent == []
    assert [held.call_id for held in messages.snapshot(['es2_knn']).held] == [call_id]


def test_a_call_cancelled_while_it_ran_on_a_worker_that_is_gone_is_marked_stopped_once_uncounted(
        broker, tiny_source, make_user, api_as, configure, lanes_redis):
    from unittest import mock

    from capacity.config import get_config
    from workers import lifecycle
    configure(es2_knn=1)
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    call = Work.objects.get(pk=call_id)
    lifecycle.start(call, 'gone@host pid 1')  # its node took it, then died with it
    with mock.patch('workers.celery.app.control.revoke'):
        assert client.delete(f'/tasks/{call_id}/', HTTP_PREFER='wait=0').json()['state'] == 'cancelled'
    stale = timezone.now() - timedelta(seconds=get_config().lease_seconds + 1)
    Work.objects.filter(pk=call_id).update(heartbeat_at=stale)
    assert holds(lanes_redis, call_id) > 0  # still counted: a live run would renew them

    assert sweep.sweep(grace_seconds=60).stopped == []  # a live run's leases would still be there
    for key in call.lease['keys']:  # ...they expired: nobody renewed them
        if lanes_redis.zscore(key, call_id) is not None:
            lanes_redis.zadd(key, {call_id: 1})
    with mock.patch('workers.lifecycle.reads.emit') as lines:
        assert sweep.sweep(grace_seconds=60).stopped == [call_id]

    row = Work.objects.get(pk=call_id)
    assert row.state == 'cancelled' and row.heartbeat_at is None  # no worker runs it, says the row
    assert lines.call_args_list == []  # its call's line was written when it was cancelled
    assert holds(lanes_redis, call_id) == 0
    assert sweep.sweep(grace_seconds=60).stopped == []
