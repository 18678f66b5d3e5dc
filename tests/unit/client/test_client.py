"""Client: one HTTP conversation at a time, against the fake API."""
import json
import time

import pytest

from heavy_lanes_client import (
    CapacityRefused,
    Client,
    InvalidRequest,
    RateLimited,
    ServerError,
    State,
    TaskNotFound,
    TransportError,
)
from tests.unit.client.fake_api import EndedFailed, Error, Invalid, RateLimit, Refuse

SOURCE = '/orgs/HPO/sources/HPO/'


def test_a_heavy_call_carries_its_token_idempotency_key_and_capacity_aware_flag(api, client):
    handle = client.submit_match(['chest pain'], SOURCE, semantic=True, idempotency_key='key-1')

    (post,) = api.posts()
    assert post.headers['authorization'] == 'Token t-core'
    assert post.headers['idempotency-key'] == 'key-1'
    assert json.loads(post.headers['x-ocl-event-metadata'])['capacity_aware'] == 'true'
    assert post.query == {'semantic': 'true', 'limit': '5'}
    assert post.body == {'rows': [{'name': 'chest pain'}], 'target_repo_url': SOURCE}
    assert handle.state == State.QUEUED and handle.url == f'/tasks/{handle.id}/'
    assert handle.idempotency_key == 'key-1'


def test_every_heavy_call_gets_a_key_of_its_own_when_none_is_given(api, client):
    client.submit_match(['a'], SOURCE)
    client.submit_rerank('q', ['a', 'b'])

    keys = [post.headers['idempotency-key'] for post in api.posts()]
    assert len(keys) == 2 and len(set(keys)) == 2 and all(keys)


def test_the_suggested_concurrency_is_read_from_the_answer(api, client):
    api.suggested = 3

    handle = client.submit_match(['a'], SOURCE)

    assert handle.capacity.suggested == 3
    assert handle.capacity.decision == 'admitted'
    assert handle.capacity.tier == 'core'


def test_a_capacity_refusal_a_rate_limit_and_a_server_error_are_three_different_errors(api, client):
    api.script.extend([Refuse(retry_after=7, scope='es2_knn', suggested=1), RateLimit(retry_after=3),
                       Error(503)])

    with pytest.raises(CapacityRefused) as refused:
        client.submit_match(['a'], SOURCE)
    with pytest.raises(RateLimited) as limited:
        client.submit_match(['a'], SOURCE)
    with pytest.raises(ServerError) as failed:
        client.submit_match(['a'], SOURCE)

    assert (refused.value.retry_after, refused.value.scope, refused.value.paused) == (7, 'es2_knn', False)
    assert refused.value.capacity.suggested == 1
    assert not isinstance(limited.value, CapacityRefused) and limited.value.retry_after == 3
    assert failed.value.status == 503 and failed.value.error_code == 'queue_unavailable'
    assert failed.value.retryable


def test_a_400_names_the_bad_fields_and_is_not_retryable(api, client):
    api.script.append(Invalid({'target_repo_url': ['Unknown source.']}))

    with pytest.raises(InvalidRequest) as rejected:
        client.submit_match(['a'], '/orgs/NOPE/sources/NOPE/')

    assert rejected.value.fields == {'target_repo_url': ['Unknown source.']}
    assert 'target_repo_url: Unknown source.' in str(rejected.value)
    assert not rejected.value.retryable


def test_no_server_is_a_transport_error():
    with Client('http://127.0.0.1:9', 'x', timeout=(0.5, 0.5)) as client, pytest.raises(TransportError) as ex:
        client.submit_match(['a'], SOURCE)
    assert ex.value.retryable


def test_wait_long_polls_until_the_task_ends(api, client):
    api.task_seconds = 0.2
    handle = client.submit_match(['pounding headache'], SOURCE)

    task = client.wait(handle, long_poll=5)

    assert task.state == State.SUCCEEDED
    assert task.result[0]['results'][0]['display_name'] == 'Pounding Headache'
    polls = api.requests('GET', '/tasks/')
    assert len(polls) == 1 and polls[0].query == {'wait': '5'}


def test_wait_pauses_for_the_retry_after_hint_when_the_server_does_not_hold_the_poll(api, client):
    api.long_poll_cap = 0  # the server answers at once, with Retry-After: 1
    api.task_seconds = 0.15
    asked = []

    def sleep(seconds):
        asked.append(seconds)
        time.sleep(0.05)

    task = client.wait(client.submit_match(['a'], SOURCE), long_poll=5, sleep=sleep)

    assert task.state == State.SUCCEEDED
    assert asked and all(0.9 <= seconds <= 1.0 for seconds in asked)


def test_wait_shows_each_poll_with_how_far_a_running_task_has_got(api, client):
    api.long_poll_cap = 0
    api.hold_tasks, api.rows_done = True, 2
    handle = client.submit_match(['a', 'b', 'c'], SOURCE)
    seen = []
    task = client.wait(handle, long_poll=0, timeout=0.5, sleep=lambda seconds: time.sleep(0.02),
                       on_task=seen.append)
    assert task.state == State.RUNNING and (task.rows_done, task.rows_total) == (2, 3)
    assert seen and seen[-1] == task
    client.cancel(handle)


def test_cancel_deletes_the_task_and_an_ended_task_reports_how_it_ended(api, client):
    api.hold_tasks = True
    held = client.submit_match(['a'], SOURCE)
    api.hold_tasks = False
    api.task_seconds = 0
    done = client.submit_match(['b'], SOURCE)
    client.wait(done)

    assert client.cancel(held).state == State.CANCELLED
    assert client.cancel(done).state == State.SUCCEEDED
    deletes = api.requests('DELETE')
    assert [seen.path for seen in deletes] == [f'/tasks/{held.id}/', f'/tasks/{done.id}/']


def test_a_task_of_someone_else_is_not_found(api, client):
    handle = client.submit_match(['a'], SOURCE)
    with Client(api.url, 't-preview') as other, pytest.raises(TaskNotFound):
        other.get_task(handle)


def test_a_lexical_match_is_answered_in_the_request_and_needs_no_polling(monkeypatch, client, api):
    class Answer:
        status_code = 200
        headers = {}

        @staticmethod
        def json():
            return {'results': [{'row': {'name': 'a'}, 'candidates': []}]}

    monkeypatch.setattr(client.session, 'request', lambda *args, **kwargs: Answer())
    handle = client.submit_match(['a'], SOURCE, semantic=False)

    assert handle.immediate is not None and not handle.pollable
    assert client.wait(handle).result == {'results': [{'row': {'name': 'a'}, 'candidates': []}]}
    assert api.requests() == []  # nothing was polled


def test_a_submission_that_may_wait_asks_for_it_and_reads_a_call_that_failed_in_time_as_ended(api, client):
    api.script.append(EndedFailed())
    handle = client.submit_match(['chest pain'], SOURCE, wait=7)
    (post,) = api.posts()
    assert post.headers['prefer'] == 'respond-async, wait=7'
    assert handle.immediate is not None and handle.immediate.state == State.FAILED
    assert handle.immediate.error == 'rows[0].name: a bad row' and client.wait(handle) is handle.immediate
    with pytest.raises(InvalidRequest):  # without a task behind it, a 400 is the request's own fault
        api.script.append(Invalid())
        client.submit_match(['chest pain'], SOURCE, wait=7)
    client.submit_match(['chest pain'], SOURCE)
    assert api.posts()[-1].headers['prefer'] == 'respond-async'
