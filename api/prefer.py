"""The `Prefer` request header (RFC 7240): `respond-async` (answer with a handle) and `wait=N` (seconds).

Without `respond-async` a heavy call waits in the request for its result, up to `wait=N` or the configured
default wait, capped by `wait.max_seconds`. `respond-async` alone answers a handle at once; with `wait=N`
beside it (the RFC's own example, section 4.1) the request waits up to N seconds and answers the result if
the call ended by then, else the handle: a client that would poll gets a quick call's answer in one
request. Preferences the server doesn't know are ignored, as the RFC asks; a malformed `wait` is ignored
too (the default applies).

The header is read whole, however long (the server bounds header sizes): an earlier cut at 1000 characters
lost a `respond-async` sent after longer preferences, and the call waited in the request. Preferences are
split with the standard library's RFC 2068 list parser, so a comma inside a quoted value doesn't end one.
"""
from dataclasses import dataclass
from urllib.request import parse_http_list


@dataclass(frozen=True)
class Preferences:
    respond_async: bool = False
    wait: int | None = None  # the seconds asked for with wait=N

    def seconds(self, default, maximum):
        """How long to wait in the request: wait=N, else `default` (0 for respond-async), at most `maximum`."""
        if self.respond_async and self.wait is None:
            return 0
        return max(0, min(self.wait if self.wait is not None else default, maximum))

    def applied(self, waited):
        """The Preference-Applied value for an answer that waited `waited` seconds (or answered a handle)."""
        applied = ['respond-async'] if self.respond_async else []
        if self.wait is not None and waited:
            applied.append(f'wait={waited}')
        return ', '.join(applied) or None


def parse(header):
    """Preferences of one or more comma-joined Prefer values; never raises."""
    respond_async, wait = False, None
    for preference in parse_http_list(header or ''):
        token = preference.split(';', 1)[0].strip().lower()  # parameters after ';' are for others
        if token == 'respond-async':
            respond_async = True
        elif token.startswith('wait='):
            value = token.split('=', 1)[1].strip().strip('"')
            if value.isascii() and value.isdecimal() and len(value) <= 9:
                wait = int(value)
    return Preferences(respond_async, wait)
