"""What a heavy call's work does once a worker runs it.

The matching domain (concepts) knows nothing about lanes; this is the one place that maps an endpoint to
its domain function.
"""
from capacity.constants import MATCH, RERANK


class UnknownEndpoint(LookupError):
    pass


def perform(work):
    """Run the domain work of `work` (a Work row) and return its JSON-able result."""
    from concepts import services as service
    if work.endpoint == MATCH:
        return service.run_match(work.payload, semantic=work.semantic, reranker=work.reranker)
    if work.endpoint == RERANK:
        return service.run_rerank(work.payload)
    raise UnknownEndpoint(f'No work for endpoint "{work.endpoint}".')
