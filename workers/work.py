"""What a heavy call's work does once a worker runs it.

The matching domain (concepts) knows nothing about lanes; this is the one place that maps an endpoint to
its domain function. The domain reports how many rows it has done as it goes; workers.progress writes that
on the work's row in batches, for the calls' `progress`.
"""
from capacity.constants import MATCH, RERANK
from workers.progress import RowProgress


class UnknownEndpoint(LookupError):
    pass


def perform(work):
    """Run the domain work of `work` (a Work row, running) and return its JSON-able result."""
    from concepts import services as service
    progress = RowProgress(work)
    if work.endpoint == MATCH:
        return service.run_match(work.payload, semantic=work.semantic, reranker=work.reranker, progress=progress)
    if work.endpoint == RERANK:
        return service.run_rerank(work.payload, progress=progress)
    raise UnknownEndpoint(f'No work for endpoint "{work.endpoint}".')
