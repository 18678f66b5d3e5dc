"""The log sink: a writer thread behind a bounded queue, so a call never waits for its log line."""
import io
import json
import threading
import time
import uuid

import pytest

from capacity import logs


class BlockingStream:
    """A stream whose write waits for `gate`; it records each line and the thread that wrote it."""

    def __init__(self, blocked=True):
        self.gate = threading.Event()
        if not blocked:
            self.gate.set()
        self.entered = threading.Event()
        self.lines = []
        self.writers = set()

    def write(self, text):
        self.entered.set()
        self.gate.wait()
        self.writers.add(threading.current_thread().name)
        self.lines.extend(text.splitlines())

    def flush(self):
        pass


@pytest.fixture
def stream():
    stream = BlockingStream()
    yield stream
    stream.gate.set()  # never leave a writer thread blocked


def test_a_line_is_printed_by_the_writer_thread(stream):
    stream.gate.set()
    sink = logs.LineSink(stream=stream)
    assert sink.put({'event': 'ocl_capacity', 'decision': 'admitted', 'error': None})
    assert sink.drain(2)
    assert stream.lines == ['{"event":"ocl_capacity","decision":"admitted"}']
    assert stream.writers == {'ocl-capacity-log'}


def test_values_json_cant_hold_become_strings():
    out = io.StringIO()
    sink = logs.LineSink(stream=out)
    task = uuid.UUID(int=7)
    sink.put({'task': task, 'n': 1})
    assert sink.drain(2)
    assert json.loads(out.getvalue()) == {'task': str(task), 'n': 1}


def test_a_blocked_log_sink_never_blocks_the_call(stream):
    sink = logs.LineSink(max_queued=2, stream=stream)
    started = time.monotonic()
    results = [sink.put({'n': n}) for n in range(10)]
    assert time.monotonic() - started < 0.5
    assert sink.dropped > 0
    assert results.count(False) == sink.dropped
    assert not sink.drain(0.1)
    stream.gate.set()
    assert sink.drain(2)
    assert sink.put({'n': 10})
    assert sink.drain(2)
    last = json.loads(stream.lines[-1])
    assert last['log_dropped'] == results.count(False)
    assert sink.dropped == 0
    assert len(stream.lines) - 1 + last['log_dropped'] == 10


def test_drain_waits_for_a_line_being_written(stream, monkeypatch):
    sink = logs.LineSink(stream=stream)
    logs._sinks.set(sink)
    sink.put({'n': 1})
    assert stream.entered.wait(2)  # the writer took the line off the queue and is writing it
    assert sink.lines.empty()
    assert not logs.drain(0.1)
    threading.Timer(0.2, stream.gate.set).start()
    assert logs.drain(2)
    assert stream.lines == ['{"n":1}']
    logs.reset()


def test_concurrent_emitters_keep_the_dropped_count_right():
    class SlowStream(BlockingStream):
        def write(self, text):
            time.sleep(0.0005)  # slower than the emitters, so the queue of 1 overflows
            super().write(text)

    stream = SlowStream(blocked=False)
    sink = logs.LineSink(max_queued=1, stream=stream)

    def emit_many():
        for n in range(50):
            sink.put({'n': n})

    threads = [threading.Thread(target=emit_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sink.drain(5)
    reported = sum(json.loads(line).get('log_dropped', 0) for line in stream.lines)
    assert reported + sink.dropped > 0
    assert len(stream.lines) + reported + sink.dropped == 200


def test_each_process_gets_its_own_sink():
    logs.reset()
    sink = logs.get_sink()
    assert logs.get_sink() is sink
    logs._sinks._state = (-1, sink)  # as a forked child sees its parent's sink
    assert logs.get_sink() is not sink
    assert logs.drain(0.1)  # nothing queued
    logs.reset()
