"""How far a running work has got, written in batches: its rows done, for its calls' `progress`.

    progress = RowProgress(work)      # the domain calls progress(rows_done, rows_total) as it goes
    service.run_match(payload, semantic, reranker, progress=progress)

A write is one UPDATE of the work's row (workers.lifecycle.note_rows), made when another tenth of the rows
is done or a second has passed since the last write with more rows done, whichever comes first: about ten
writes for a call, plus one a second for a slow one, never one a row. All rows done is never written: the
run's end is recorded right after it (its state, workers.lifecycle.succeed), and a write then would be one
round trip more between a pool process's calls, for a call of up to 64 rows its only one (one slice,
concepts.services.chunks). A write that fails (the database restarting) is skipped: progress is a hint,
and the run goes on; the next write catches up.
"""
import logging
import math
import time

from common.database import DATABASE_DOWN
from workers import lifecycle

logger = logging.getLogger('heavy_lanes')

EVERY_SECONDS = 1.0  # write at least this often while rows get done
EVERY_SHARE = 0.1    # ... and each time this share of the rows is done


class RowProgress:
    """A callback `(rows_done, rows_total)` for one run of `work` that writes its progress in batches."""

    def __init__(self, work, write=None, clock=time.monotonic, every_seconds=EVERY_SECONDS,
                 every_share=EVERY_SHARE):
        self.work = work
        self.write = write or lifecycle.note_rows
        self.clock = clock
        self.every_seconds = every_seconds
        self.every_share = every_share
        self.written = 0  # the run started at 0 (its claim wrote it)
        self.written_at = clock()
        self.writes = 0

    def __call__(self, rows_done, rows_total):
        if rows_done <= self.written or rows_done >= rows_total:
            return
        now = self.clock()
        step = max(1, math.ceil(rows_total * self.every_share))
        if rows_done - self.written < step and now - self.written_at < self.every_seconds:
            return
        try:
            self.write(self.work, rows_done)
        except DATABASE_DOWN as ex:
            logger.info('Progress of heavy work %s not written (%s); the run goes on', self.work.pk,
                        type(ex).__name__)
            return
        self.written, self.written_at = rows_done, now
        self.writes += 1
