"""A one-line progress bar on stderr: rows done, rows the server has done in calls still running (their
`progress`), failed, calls in flight and waiting for capacity.

On a terminal the line is redrawn in place about five times a second; elsewhere (a log file, CI) a plain
line is written every `log_interval` seconds. No dependency beyond the standard library.
"""
import sys
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    total: int
    matched: int
    no_match: int
    failed: int
    in_flight: int
    limit: int
    waiting: int   # calls waiting out a 429 (capacity or rate limit)
    elapsed: float  # seconds
    running: int = 0  # rows done on the server by calls still running (their `progress`), not yet in `done`

    @property
    def done(self):
        return self.matched + self.no_match + self.failed


def render(label, snap, width=24):
    """The line: `#` for rows done, `+` for rows the server has done in calls still running."""
    filled = int(width * snap.done / snap.total) if snap.total else width
    ahead = min(width - filled, int(width * (snap.done + snap.running) / snap.total) - filled) if snap.total else 0
    bar = '#' * filled + '+' * ahead + '-' * (width - filled - ahead)
    running = f' (+{snap.running} running)' if snap.running else ''
    return (f'{label} [{bar}] {snap.done}/{snap.total} rows{running} | matched {snap.matched}  '
            f'no match {snap.no_match}  failed {snap.failed} | in flight {snap.in_flight}/{snap.limit}  '
            f'waiting for capacity {snap.waiting} | {snap.elapsed:.0f} s')


class Progress:
    """Draws `snapshot()` until closed. `tty` defaults to whether `stream` is a terminal."""

    def __init__(self, label, stream=None, tty=None, interval=0.2, log_interval=5.0):
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if self.tty else log_interval
        self._snapshot = None
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self._last_width = 0

    def start(self, snapshot):
        self._snapshot = snapshot
        self._thread = threading.Thread(target=self._loop, name='heavy-lanes-progress', daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.draw()

    def draw(self, final=False):
        if self._snapshot is None:
            return
        line = render(self.label, self._snapshot())
        with self._lock:
            if self.tty:
                pad = ' ' * max(0, self._last_width - len(line))
                self.stream.write('\r' + line + pad + ('\n' if final else ''))
                self._last_width = len(line)
            else:
                self.stream.write(line + '\n')
            self.stream.flush()

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self.draw(final=True)
