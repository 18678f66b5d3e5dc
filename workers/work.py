"""What a heavy call does once a worker runs it, and the usage it costs.

The matching domain (concepts) knows nothing about lanes; this is the one place that maps an endpoint to
its domain function.
"""
from django.utils import timezone

from capacity.constants import MATCH, RERANK


class UnknownEndpoint(LookupError):
    pass


def perform(call):
    """Run the domain work of `call` (a HeavyCall row) and return its JSON-able result."""
    from concepts import services as service
    if call.endpoint == MATCH:
        return service.run_match(call.payload, semantic=call.semantic, reranker=call.reranker)
    if call.endpoint == RERANK:
        return service.run_rerank(call.payload)
    raise UnknownEndpoint(f'No work for endpoint "{call.endpoint}".')


def charge(call):
    """Meter one admitted call: `rows` units, once (an idempotent replay returns the same row)."""
    from api.models import UsageEvent
    UsageEvent.objects.create(user_id=call.owner_id, call_id=call.pk, action=call.endpoint, units=call.rows)


def refund(call):
    """Give back the usage of a call that failed; idempotent."""
    from api.models import UsageEvent
    UsageEvent.objects.filter(call_id=call.pk, refunded_at__isnull=True).update(refunded_at=timezone.now())
