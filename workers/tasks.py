"""The Celery task: a thin wrapper around workers.execution.run (imported by worker processes only)."""
from workers import execution
from workers.celery import TASK_NAME, app


# The result is stored by workers.lifecycle.succeed, in the transaction that marks the call succeeded, so
# Celery stores nothing itself (ignore_result). acks_late: a message is acknowledged once the call ended;
# a pool process that dies mid-call leaves it to be delivered again (reject_on_worker_lost).
@app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_heavy_call(self, call_id):
    """Run one admitted heavy call (its id is the Celery task id and the lease token)."""
    return execution.run(call_id, node=self.request.hostname or '')
