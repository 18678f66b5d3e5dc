"""A bulk lane's pool processes run at a lower CPU priority than the API and the interactive lane
(workers.signals.yield_to_requests). Each case runs in a forked child: niceness can't be raised back."""
import os

import pytest

from workers import signals


def niceness_after_init(served, niceness):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a pool process of a node that serves `served`
        try:
            from django.conf import settings
            settings.WORKERS_BULK_NICENESS = niceness
            signals._served[:] = served
            signals.yield_to_requests()
            os.write(write, str(os.nice(0)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        return int(pipe.read()) - os.nice(0)


@pytest.mark.parametrize('served, niceness, lowered', [
    (['es2_knn'], 10, 10),
    (['api_heavy'], 7, 7),
    (['es2_knn', 'api_heavy'], 10, 10),
    (['interactive'], 10, 0),               # a person's single-row call keeps its priority
    (['interactive', 'es2_knn'], 10, 0),    # a node that also runs them does too
    (['es2_knn'], 0, 0),                    # 0 turns it off
])
def test_only_a_node_of_bulk_lanes_lowers_its_pool_processes_priority(served, niceness, lowered):
    assert niceness_after_init(served, niceness) == lowered
