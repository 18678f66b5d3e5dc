"""The request id: one per HTTP request, carried into every log line written while it is served and into
the heavy call it submits (the call's row, so its worker's lines carry it too).

It comes from the `X-Request-Id` header (nginx sets one, a client may) when that is a plain token of at
most MAX_LENGTH characters, else a new one is made (uuid4 hex). It is kept in a context variable, so
threads and asyncio tasks of other requests never see it. No Django import.
"""
import contextvars
import re
import uuid
from contextlib import contextmanager

MAX_LENGTH = 100  # = capacity.caller.RequestFacts.cid, which reads the same header
VALID = re.compile(r'[A-Za-z0-9][A-Za-z0-9._:@/+=-]*')

_current = contextvars.ContextVar('heavy_lanes_request_id', default=None)


def clean(raw):
    """`raw` when it is a usable request id, else None (too long, empty, or characters a log or a header
    shouldn't carry)."""
    if not isinstance(raw, str) or not 0 < len(raw) <= MAX_LENGTH or not VALID.fullmatch(raw):
        return None
    return raw


def make():
    return uuid.uuid4().hex


def from_header(raw):
    """The request id for a request whose X-Request-Id is `raw` (None when absent)."""
    return clean(raw) or make()


def get():
    """The request id bound in this context, or None."""
    return _current.get()


@contextmanager
def bound(request_id):
    """Bind `request_id` for the block (None binds nothing new)."""
    token = _current.set(request_id)
    try:
        yield request_id
    finally:
        _current.reset(token)


def bind(request_id):
    """Bind `request_id` until `unbind(token)`; for code that can't use a with block (signal pairs)."""
    return _current.set(request_id)


def unbind(token):
    try:
        _current.reset(token)
    except ValueError:  # a token from another context: set it back to nothing instead
        _current.set(None)
