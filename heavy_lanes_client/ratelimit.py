"""Reading the IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers-11) with the standard
library alone: `RateLimit-Policy` and `RateLimit` are Structured Field lists (RFC 9651) of items, each a
policy name with parameters.

    RateLimit-Policy: "es2_knn";q=2;qu="concurrent-requests", "rate";q=600;w=60
    RateLimit: "es2_knn";r=0;t=2, "rate";r=599;t=60

`parse_list` reads the part of the syntax these fields use (items that are Strings or Tokens, parameters
that are Integers, Decimals, Strings, Tokens, Byte Sequences or Booleans; no inner lists). A field that
doesn't parse is ignored, as the draft requires: `parse_list` returns None for it. `concurrency` turns
the two fields into what a client acts on: how many more calls the server has room for now, and when a
full quota is expected to have room again.
"""
import base64
import binascii
import re
from dataclasses import dataclass

CONCURRENT = 'concurrent-requests'
_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9:/!#$%&'*+\-.^_`|~]*")
_KEY = re.compile(r'[a-z*][a-z0-9_\-.*]*')
_NUMBER = re.compile(r'-?[0-9]{1,15}(\.[0-9]{1,3})?')


class Malformed(ValueError):
    pass


class _Reader:
    def __init__(self, text):
        self.text = text
        self.at = 0

    def peek(self):
        return self.text[self.at] if self.at < len(self.text) else ''

    def skip(self, chars=' '):
        while self.peek() and self.peek() in chars:
            self.at += 1

    def take(self, pattern):
        found = pattern.match(self.text, self.at)
        if not found:
            raise Malformed(f'unexpected {self.text[self.at:self.at + 10]!r}')
        self.at = found.end()
        return found.group(0)

    def bare_item(self):
        char = self.peek()
        if char == '"':
            return self.string()
        if char == ':':
            return self.bytes()
        if char == '?':
            self.at += 1
            value = self.peek()
            if value not in ('0', '1'):
                raise Malformed('bad boolean')
            self.at += 1
            return value == '1'
        if char == '-' or char.isdigit():
            number = self.take(_NUMBER)
            return float(number) if '.' in number else int(number)
        return self.take(_TOKEN)

    def string(self):
        self.at += 1
        out = []
        while True:
            char = self.peek()
            if not char:
                raise Malformed('unterminated string')
            self.at += 1
            if char == '"':
                return ''.join(out)
            if char == '\\':
                escaped = self.peek()
                if escaped not in ('"', '\\'):
                    raise Malformed('bad escape')
                self.at += 1
                out.append(escaped)
            elif ' ' <= char <= '~':
                out.append(char)
            else:
                raise Malformed('bad character in string')

    def bytes(self):
        end = self.text.find(':', self.at + 1)
        if end < 0:
            raise Malformed('unterminated byte sequence')
        try:
            value = base64.b64decode(self.text[self.at + 1:end], validate=True)
        except (binascii.Error, ValueError) as ex:
            raise Malformed('bad byte sequence') from ex
        self.at = end + 1
        return value

    def parameters(self):
        params = {}
        while self.peek() == ';':
            self.at += 1
            self.skip()
            key = self.take(_KEY)
            value = True
            if self.peek() == '=':
                self.at += 1
                value = self.bare_item()
            params[key] = value
        return params


def parse_list(text):
    """[(name, {param: value})] of one Structured Field list, or None when it is missing or malformed."""
    if not text:
        return None
    reader = _Reader(str(text).strip())
    members = []
    try:
        while True:
            if reader.peek() == '(':
                raise Malformed('inner lists are not RateLimit items')
            name = reader.bare_item()
            members.append((name, reader.parameters()))
            reader.skip(' \t')
            if not reader.peek():
                return members
            if reader.peek() != ',':
                raise Malformed('expected a comma')
            reader.at += 1
            reader.skip(' \t')
            if not reader.peek():
                raise Malformed('trailing comma')
    except Malformed:
        return None


@dataclass(frozen=True)
class Concurrency:
    """What the RateLimit fields say about concurrency quotas (`qu="concurrent-requests"`)."""

    left: int | None = None   # the fewest calls any of them has room for now (None: no such quota counted)
    quota: int | None = None  # the smallest of them (`q`): never more at once than that
    reset: int | None = None  # seconds until a full one is expected to have room (its `t`), if said


def concurrency(headers):
    """The Concurrency of an answer's RateLimit-Policy and RateLimit fields (Concurrency() without them)."""
    policies = parse_list(headers.get('RateLimit-Policy'))
    limits = parse_list(headers.get('RateLimit'))
    if not policies or not limits:
        return Concurrency()
    concurrent = {(name, params.get('pk')): params.get('q') for name, params in policies
                  if params.get('qu') == CONCURRENT and isinstance(params.get('q'), int)}
    left, quota, reset = None, None, None
    for name, params in limits:
        remaining = params.get('r')
        size = concurrent.get((name, params.get('pk')))
        if size is None or not isinstance(remaining, int) or remaining < 0:
            continue
        left = remaining if left is None else min(left, remaining)
        quota = size if quota is None else min(quota, size)
        window = params.get('t')
        if remaining == 0 and isinstance(window, int) and window >= 0:
            reset = window if reset is None else max(reset, window)
    return Concurrency(left=left, quota=quota, reset=reset)


def wait_seconds(headers):
    """Seconds until every exhausted quota (r=0) is expected to have room, from RateLimit's `t`; None when
    none says."""
    waits = [params['t'] for _, params in parse_list(headers.get('RateLimit')) or []
             if params.get('r') == 0 and isinstance(params.get('t'), int) and params['t'] >= 0]
    return max(waits) if waits else None
