"""The Python client's calls by run against a live server (the real broker and lanes): list a run's tasks,
cancel the run, send a cancelled task again."""
import pytest

from heavy_lanes_client import Client, State, errors
from tests.integration.workers.test_queue import holds

pytestmark = pytest.mark.redis


def test_the_client_lists_a_runs_tasks_cancels_the_run_and_sends_a_task_again(
        live_server, broker, lanes_redis, tiny_source, make_user, configure):
    configure(es2_knn=1)  # es2_knn paused: every call waits in its queue
    user = make_user()
    with Client(live_server.url, user.auth_token.key) as client:
        handles = [client.submit_match([f'fever {i}', 'chest pain'], tiny_source, metadata={
            'automatch_run_id': 'run-c'}) for i in range(3)]
        other = client.submit_match(['rash'], tiny_source, metadata={'automatch_run_id': 'run-d'})
        listed = list(client.tasks(run='run-c', page_size=2))  # two pages
        assert [task.id for task in listed] == [handle.id for handle in reversed(handles)]
        assert all(task.state == State.QUEUED and task.result is None for task in listed)

        assert client.cancel_run('run-c') == 3
        assert [task.state for task in client.tasks(run='run-c')] == [State.CANCELLED] * 3
        assert [task.id for task in client.tasks(state=[State.QUEUED])] == [other.id]
        assert all(holds(lanes_redis, handle.id) == 0 for handle in handles)

        again = client.retry(listed[0])
        assert again.id not in {handle.id for handle in handles} and again.state == State.QUEUED
        assert client.get_task(again).state == State.QUEUED
        assert [task.id for task in client.tasks(run='run-c', state='queued')] == [again.id]
        with pytest.raises(errors.RequestRejected) as conflict:
            client.retry(again)
        assert conflict.value.status == 409
    with Client(live_server.url, make_user().auth_token.key) as stranger, pytest.raises(errors.TaskNotFound):
        stranger.retry(listed[1])
