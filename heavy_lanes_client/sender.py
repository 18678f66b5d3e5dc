"""Sending one batch's call: retried under the RetryPolicy, every send with the batch's Idempotency-Key.

Each answer is counted in the run's Tally and its capacity headers set the run's AdaptiveLimit; a 429's
wait holds back every other call of the run too (retry.Holdback), and counts as waiting for capacity.
When the run stops before a send, Stopped is raised; its `uncertain` says whether an earlier send got no
answer (or a 5xx other than 503), so that the server may have taken the call.
"""
from heavy_lanes_client import errors
from heavy_lanes_client.retry import Holdback, Stopped, call_with_retries
from heavy_lanes_client.tally import answer_kind


def _maybe_taken(error):
    """Whether the server may have taken a call whose send failed with `error` (a 503 queued nothing)."""
    return isinstance(error, errors.TransportError) or (isinstance(error, errors.ServerError)
                                                        and error.status != 503)


class Sender:
    """Sends the calls of one run, from every batch's thread. `sleep(seconds, stop)` returns true when the
    run is stopping."""

    def __init__(self, client, job, retry, *, tally, limit, stop, sleep, rng, clock, run_id):
        self.client = client
        self.job = job
        self.retry = retry
        self.tally = tally
        self.limit = limit
        self.stop = stop
        self.sleep = sleep
        self.rng = rng
        self.holdback = Holdback(clock)
        self.metadata = {'automatch_run_id': run_id}  # whole: the server keeps up to 255 characters

    def send(self, batch, key):
        """The Handle the server answered for `batch`; GaveUp, another ClientError or Stopped otherwise."""
        own_until = [0.0]
        uncertain = [False]

        def before_attempt():
            if self.stop.is_set():
                raise Stopped(uncertain[0])
            pause = self.holdback.pause(own_until[0])
            if pause:
                self.wait_for_capacity(batch, pause)
            return pause

        def send(attempt):
            self.tally.count('submissions')
            handle = self.job.submit(self.client, batch, key, self.metadata)
            self.tally.admitted(handle.capacity)
            self.limit.taken()  # the run's _process calls done() when its task ends
            self.limit.follow(handle.capacity, first_send=attempt == 1)
            return handle

        def on_error(error, delay):
            self.tally.count(answer_kind(error))
            if _maybe_taken(error):
                uncertain[0] = True
            if delay is not None and isinstance(error, errors.Refused):
                own_until[0] = self.holdback.hold(delay)
            self.limit.follow(error.capacity)

        def wait(delay, error):
            if isinstance(error, errors.Refused):
                return self.wait_for_capacity(batch, delay, raise_on_stop=False)
            return self.sleep(delay, self.stop)

        try:
            return call_with_retries(send, self.retry, wait=wait, rng=self.rng, before_attempt=before_attempt,
                                     on_error=on_error)
        except Stopped:
            raise Stopped(uncertain[0]) from None

    def wait_for_capacity(self, batch, seconds, raise_on_stop=True):
        """Sleep `seconds` counted as waiting for capacity; true (or Stopped) when the run stops first."""
        with self.tally.waiting_for_capacity(batch):
            stopped = self.sleep(seconds, self.stop)
        if stopped and raise_on_stop:
            raise Stopped()
        return stopped
