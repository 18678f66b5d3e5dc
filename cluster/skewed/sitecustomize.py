"""Loaded by every Python process of a host whose clock the harness sets ahead (cluster.hosts, through
PYTHONPATH): `time.sleep` through `select`, because of the tool that sets the clock, not the service.

libfaketime (Debian 12's 0.9.10), told to fake the wall clock only (FAKETIME_DONT_FAKE_MONOTONIC), answers
EINVAL to clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which is how Python's time.sleep waits: every
sleep of the host raised OSError, so the fault tested a host whose sleeps fail, not one whose clock is ahead
(heartbeat threads died, row waits failed). A relative select() timeout isn't touched by the offset, and the
wall clock (time.time, datetime.now) stays 30 s ahead, which is the fault. Faking the monotonic clock too
is no way out: every timed wait then sleeps the offset longer.
"""
import select
import time


def sleep(seconds):
    if seconds < 0:
        raise ValueError('sleep length must be non-negative')
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


time.sleep = sleep
