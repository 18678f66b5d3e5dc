"""What a heavy call does once a worker runs it, and giving back the usage of one that failed.

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


def refund(call):
    """Give back the usage of a call that failed (its row is its usage record); idempotent."""
    from workers.models import HeavyCall
    HeavyCall.objects.filter(pk=call.pk, refunded_at__isnull=True).update(refunded_at=timezone.now())
