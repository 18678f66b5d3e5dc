"""One JSON line per event on stdout, written by a daemon thread so a call never waits for its log.

`emit(record)` serializes the record in the caller's thread and puts the line on a bounded queue. When the
queue is full the line is dropped and counted; the next line that gets through carries `log_dropped` with
that count. At exit a process waits at most DRAIN_SECONDS for queued lines (gunicorn recycles workers and
`manage.py capacity` exits right after logging).

This module imports nothing from Django (common.process doesn't either), so subprocess tests can check that
a process exits.
"""
import atexit
import json
import queue
import sys
import threading

from common.process import PerProcess

MAX_QUEUED_LINES = 1000
DRAIN_SECONDS = 2.0


def to_line(record):
    """Serialize compactly, dropping None values; non-JSON values (datetimes, UUIDs) become strings."""
    return json.dumps({k: v for k, v in record.items() if v is not None}, separators=(',', ':'), default=str)


class LineSink:
    """A bounded queue of lines and the daemon thread that writes them."""

    def __init__(self, max_queued=MAX_QUEUED_LINES, stream=None):
        self.lines = queue.Queue(maxsize=max_queued)
        self.stream = stream
        self.dropped = 0  # lines dropped since the last line that got through
        self.pending = 0  # lines queued or being written
        self.condition = threading.Condition()
        self.thread = threading.Thread(target=self.run, name='ocl-capacity-log', daemon=True)
        self.thread.start()

    def put(self, record):
        with self.condition:
            dropped = self.dropped
            line = to_line({**record, 'log_dropped': dropped or None})
            try:
                self.lines.put_nowait(line)
            except queue.Full:
                self.dropped += 1
                return False
            self.dropped -= dropped
            self.pending += 1
            return True

    def run(self):
        while True:
            line = self.lines.get()
            try:
                self.write(line)
            finally:
                with self.condition:
                    self.pending -= 1
                    self.condition.notify_all()

    def write(self, line):
        try:
            stream = self.stream or sys.stdout
            stream.write(line + '\n')
            stream.flush()
        except Exception:  # noqa: BLE001 - a log line must never fail or stop the writer
            pass

    def drain(self, timeout):
        """Wait until every queued line is written; return whether that happened within `timeout` s."""
        with self.condition:
            return self.condition.wait_for(lambda: self.pending == 0, timeout=timeout)


_sinks = PerProcess(LineSink)


def get_sink():
    """The sink of this process, made on first use and again after a fork."""
    return _sinks.get()


def emit(record):
    """Queue one JSON line; never blocks and never raises on a full queue."""
    return get_sink().put(record)


def reset():
    """Forget this process's sink (tests)."""
    _sinks.clear()


@atexit.register
def drain(timeout=DRAIN_SECONDS):
    """Wait at most `timeout` s for this process's queued lines; True when none is left."""
    sink = _sinks.peek()
    if sink is None:
        return True
    return sink.drain(timeout)
