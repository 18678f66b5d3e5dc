"""The `Prefer` request header (RFC 7240): respond-async, or wait=N seconds for the result."""


def wait_seconds(header, default, maximum, capacity_aware=False):
    """Seconds to wait in the request for the result: 0 for respond-async or capacity-aware clients."""
    if capacity_aware:
        return 0
    wait = None
    for preference in (header or '').split(','):
        token = preference.strip().lower()
        if token == 'respond-async':
            return 0
        if token.startswith('wait='):
            try:
                wait = int(token.split('=', 1)[1].strip())
            except ValueError:
                continue
    if wait is None:
        wait = default
    return max(0, min(wait, maximum))
