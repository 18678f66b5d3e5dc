"""A running call shows how far it has got: `progress` moves on a 1,000-row call run by a real worker."""
import time

import pytest

from tests.integration.workers.test_queue import poll, read_whole, running_pid, submit_long

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_a_running_calls_progress_moves_through_its_rows(start_worker, tiny_source, make_user, api_as, lanes_redis):
    start_worker()
    client = api_as(make_user())
    call_id = submit_long(client, tiny_source)  # 1,000 rows, semantic and reranked
    running_pid(call_id)
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        task = read_whole(client.get(f'/tasks/{call_id}/')).json()
        if task['state'] != 'running':
            assert 'progress' not in task
            break
        seen.append((task['progress']['rows_done'], task['progress']['rows_total']))
    assert poll(client, call_id).json()['state'] == 'succeeded'
    done = [rows for rows, _ in seen]
    assert {total for _, total in seen} == {1000}
    assert done == sorted(done)  # it only moves forward
    # It moved while the call ran: at least two different counts short of the end were seen.
    assert len({rows for rows in done if 0 < rows < 1000}) >= 2, done
