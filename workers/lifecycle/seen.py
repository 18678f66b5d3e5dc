"""What a call's owner sees of it: a pure function of the call and its work (no database, no Redis).

    seen(call, work).state      # its work's state, or `cancelled` once its owner cancelled it

| the call | state | started_at | finished_at | error |
|---|---|---|---|---|
| cancelled by its owner | cancelled | its work's start, if before the cancel | the cancel | CANCELLED |
| answered from a warm result | succeeded | when it was made | when it was made | — |
| any other | its work's | its work's | its work's | its work's error, or the state's message |

Nothing of the run is copied into calls: a call made to join a work shows the work as it is now.
"""
from dataclasses import dataclass
from datetime import datetime

from workers.models import FINAL_STATES, ServedAs, State

CANCELLED = 'The call was cancelled.'
EXPIRED = 'The call waited in its queue past its deadline and was not run.'
FAILED = 'The call failed.'
MESSAGES = {State.CANCELLED: CANCELLED, State.EXPIRED: EXPIRED, State.FAILED: FAILED}


@dataclass(frozen=True)
class Seen:
    state: State
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None  # what the owner is told about a call that didn't succeed

    @property
    def finished(self):
        return self.state in FINAL_STATES


def seen(call, work):
    """What the owner of `call` sees (see the module docstring); `work` is the work it points at."""
    if call.cancelled_at is not None:
        started = work.started_at if work.started_at is not None and work.started_at <= call.cancelled_at else None
        return Seen(State.CANCELLED, started, call.cancelled_at, CANCELLED)
    if call.served_as == ServedAs.CACHED:
        return Seen(State.SUCCEEDED, call.created_at, call.created_at)
    state = State(work.state)
    error = (work.error or MESSAGES[state]) if state in MESSAGES else None
    return Seen(state, work.started_at, work.finished_at if state in FINAL_STATES else None, error)
