"""The Celery tasks, thin wrappers around plain functions (imported by worker processes only): a heavy call
(workers.execution.run) and the periodic maintenance that Celery beat sends to the `maintenance` queue
(workers.sweep, workers.retention)."""
from common.database import DATABASE_DOWN
from workers import execution, notify, retention, sweep
from workers.celery import LEASES_HEADER, RETENTION_TASK, SWEEP_TASK, TASK_NAME, app

RETRY_MAX_SECONDS = 30


# The result is stored by workers.lifecycle.succeed, in the transaction that marks the call succeeded, so
# Celery stores nothing itself (ignore_result). acks_late: a message is acknowledged once the call ended;
# a pool process that dies mid-call leaves it to be delivered again (reject_on_worker_lost).
@app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_heavy_call(self, call_id):
    """Run one admitted heavy call (its id is the Celery task id and the lease token)."""
    limits = self.request.timelimit or (None, None)  # (hard, soft) seconds, from the message
    try:
        # The result is stored by the lifecycle; Celery needn't log it.
        execution.run(call_id, node=self.request.hostname or '', soft_limit=limits[1],
                      leases=getattr(self.request, LEASES_HEADER, None),
                      notice_to=getattr(self.request, notify.NOTICE_HEADER, None))
    except execution.Busy as busy:
        # Another worker runs it now. Not run, not dropped: if that worker dies, this message is its
        # redelivery; if the call ends first, the next look finds it ended.
        raise self.retry(countdown=busy.retry_in, max_retries=None) from None
    except DATABASE_DOWN as ex:
        # The call's state couldn't be recorded: never acknowledge its message as handled. A new message
        # (the same task id, its queue deadline kept) comes back after a pause that grows to 30 s.
        raise self.retry(exc=ex, countdown=min(2 ** self.request.retries, RETRY_MAX_SECONDS), max_retries=None) from ex


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep_calls():
    """End the calls past their deadline and publish again the ones whose message is gone."""
    return sweep.sweep().to_json()


@app.task(name=RETENTION_TASK, ignore_result=True)
def prune_finished_calls():
    """Delete the calls (and their results) that ended longer ago than the retention period."""
    return retention.prune()
