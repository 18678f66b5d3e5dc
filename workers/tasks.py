"""Celery tasks: thin wrappers around workers.execution, plus the worker's main-process signals."""
import logging

from celery import Task
from celery.signals import task_revoked

from workers import execution
from workers.celery import app
from workers.models import State

logger = logging.getLogger('heavy_lanes')


class HeavyCallTask(Task):
    def on_success(self, retval, task_id, args, kwargs):
        # Runs after the result backend stored the result, so a poller that sees `succeeded` finds it.
        execution.succeed(task_id)


@app.task(name='heavy_lanes.run_heavy_call', bind=True, base=HeavyCallTask, acks_late=True,
             reject_on_worker_lost=True)
def run_heavy_call(self, call_id):
    """Run one admitted heavy call (its id is the Celery task id and the lease token)."""
    return execution.run(call_id, worker=self.request.hostname or '')


@task_revoked.connect
def release_revoked(request=None, terminated=False, expired=False, **kwargs):
    """A call that won't run or was stopped: mark it and free its leases (in the worker's main process).

    `expired`: the worker received it after its queue deadline. `terminated`: a cancel stopped it while
    running (the row already says cancelled). Otherwise it was revoked before it started.
    """
    call_id = getattr(request, 'id', None)
    if not call_id:
        return
    state = State.EXPIRED if expired else State.CANCELLED
    try:
        execution.end_unstarted(call_id, state)
    except Exception:  # noqa: BLE001 - never break the worker's main loop; the leases expire on their own
        logger.exception('Could not end revoked heavy call %s', call_id)
