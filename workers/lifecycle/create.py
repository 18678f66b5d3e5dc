"""A call's start in life: its row and its message, in one transaction."""
from django.db import transaction

from capacity.admission import Admission
from capacity.config import get_config, time_limits
from workers import publisher
from workers.celery import LEASES_HEADER, TASK_NAME, app


def send(call, expires=True):
    """Publish the call's message on its queue, expiring at its queue deadline, with the time limits of the
    config in force, within the publish deadline (workers.publisher). By task name: the API never imports
    the tasks module, and so none of the workers' signal handlers.

    `expires=False` for a call that already started (sent again to take over from a worker that is gone):
    the queue deadline bounds the wait for a first start, and a worker discards a message past its
    `expires` unread, so a takeover after the deadline would never happen and the call would stay
    `running` on nobody. A call not started yet carries its worker leases (LEASES_HEADER): its worker
    renews them and claims the row in one statement, without reading it first (workers.execution.run)."""
    limits = time_limits(get_config())
    headers = {'request_id': call.request_id or None}
    if expires:  # a call not started yet: its worker renews these leases, then claims its row in one go
        headers[LEASES_HEADER] = Admission.from_json(call.admission, token=call.pk).worker_lease_message()
    publisher.publish(app.send_task, TASK_NAME, args=[call.pk], task_id=call.pk, queue=call.queue,
                      expires=call.expires_at if expires else None, priority=call.priority,
                      soft_time_limit=limits.soft, time_limit=limits.hard, headers=headers)


def enqueue(call, publish=None):
    """Insert `call` (a new, unsaved HeavyCall) and publish its message, in one transaction.

    A publish that fails rolls the row back and raises; an IntegrityError means another request with the
    same Idempotency-Key won the race (the caller answers with that call).
    """
    with transaction.atomic():
        call.save(force_insert=True)  # the row is also the call's usage record
        (publish or send)(call)
    return call
