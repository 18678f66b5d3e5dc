"""Publishing a call's message with a deadline, like every other Redis operation on the request path.

kombu bounds an operation on an established connection by its socket timeout, but not the connecting
(a DNS lookup, a Sentinel walk) nor its own publish retries: a Redis stall held submissions for up to
20 s. A publish runs on this process's publisher thread (capacity.threads.RedisThread) and the request
waits at most CELERY_PUBLISH_DEADLINE_SECONDS for it; past that the request answers 503 and rolls the call's
row back. A publish that lands later anyway is a message without a row, which the worker drops
(workers.lifecycle.load), and a publish retried by kombu after its first copy landed is a duplicate, which
the worker doesn't run twice (workers.lifecycle.start).
"""
import redis
from django.conf import settings

from capacity.threads import RedisThread
from common.process import PerProcess


class PublishTimeout(redis.TimeoutError):
    """The broker didn't take the message within the deadline (it may still land)."""


_threads = PerProcess(lambda: RedisThread(name='heavy-lanes-publish', busy='the publisher thread is busy'))


def publish(send, *args, **kwargs):
    """Run `send(*args, **kwargs)` on the publisher thread; wait at most the deadline for it."""
    deadline = settings.CELERY_PUBLISH_DEADLINE_SECONDS
    job = _threads.get().submit(lambda: send(*args, **kwargs))
    try:
        return job.result(timeout=deadline)
    except TimeoutError:
        if not job.done() and (job.cancel() or not job.done()):
            raise PublishTimeout(f'the broker took no message within {deadline} s') from None
        return job.result()
