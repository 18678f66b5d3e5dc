"""What the server's answer means: its JSON body if it has one, and the ClientError for any answer that is
not a success (capacity refusal, rate limit, server error, rejection), with its data read from the body and
the X-OCL-Capacity-* and Retry-After headers (or the IETF RateLimit fields, when those are all it has).
"""
from heavy_lanes_client import errors, ratelimit
from heavy_lanes_client.models import Capacity, retry_after_seconds


def json_or_none(response):
    """The answer's JSON body, or None when it has none (or not JSON)."""
    try:
        return response.json()
    except ValueError:
        return None


def _describe_detail(detail):
    """A 400 `detail` ({field: [messages]}) or any other detail as one line."""
    if isinstance(detail, dict):
        parts = []
        for name, messages in detail.items():
            if isinstance(messages, list):
                messages = '; '.join(str(message) for message in messages)
            parts.append(f'{name}: {messages}')
        return ' | '.join(parts)
    if isinstance(detail, list):
        return '; '.join(str(item) for item in detail)
    return '' if detail is None else str(detail)


def error_for(response, not_found=errors.RequestRejected):
    """The ClientError for a non-2xx answer: capacity refusal, rate limit, server error or rejection.

    A 429 is a capacity refusal when its `error_code` is `capacity_exceeded` (or the decision header says
    `refused`); any other 429 is a rate limit. `retry_after` comes from the Retry-After header, else the
    body's `retry_after`.
    """
    status = response.status_code
    body = json_or_none(response)
    body = body if isinstance(body, dict) else {}
    code = body.get('error_code')
    detail = body.get('detail', None if body else (response.text or '')[:300])
    capacity = Capacity.from_headers(response.headers)
    retry_after = retry_after_seconds(response.headers.get('Retry-After'))
    if retry_after is None:
        retry_after = retry_after_seconds(body.get('retry_after'))
    if retry_after is None:  # a server that says it only in the standard RateLimit field
        retry_after = retry_after_seconds(ratelimit.wait_seconds(response.headers))
    text = _describe_detail(detail)
    fields = {'status': status, 'error_code': code, 'detail': detail, 'capacity': capacity, 'retry_after': retry_after}
    if status == 429:
        wait = f', Retry-After {retry_after:g} s' if retry_after is not None else ''
        if code == 'capacity_exceeded' or (code is None and capacity.decision == 'refused'):
            scope = body.get('scope')
            paused = bool(body.get('paused'))
            what = f'lane {scope} paused' if paused else f'lane {scope} full' if scope else 'lanes full'
            return errors.CapacityRefused(f'capacity refused ({what}{wait})', scope=scope, paused=paused,
                                          **fields)
        return errors.RateLimited(f'rate limited (HTTP 429 {code or "too many requests"}{wait})', **fields)
    message = f'HTTP {status}{" " + code if code else ""}: {text}'.rstrip(': ')
    if 500 <= status < 600:
        return errors.ServerError(f'server error ({message})', **fields)
    if status == 400:
        bad_fields = detail if isinstance(detail, dict) else {}
        return errors.InvalidRequest(f'rejected ({message})', fields=bad_fields, **fields)
    if status in (401, 403):
        return errors.AuthError(f'not allowed ({message})', **fields)
    if status == 422 and code in (None, 'idempotency_conflict'):
        return errors.IdempotencyConflict(f'idempotency conflict ({message})', **fields)
    if status == 404:
        return not_found(f'not found ({message})', **fields)
    if 400 <= status < 500:
        return errors.RequestRejected(f'rejected ({message})', **fields)
    return errors.ProtocolError(f'unexpected answer ({message})', **fields)
