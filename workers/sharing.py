"""The same work runs once: identical calls share one run (singleflight), and a succeeded call's result
answers identical calls for `cache.ttl_seconds` (warm results), without admission.

    key = work_key(MATCH, payload, semantic=True, reranker=False)   # the same work, the same key
    found = find(key)          # a warm result or an open leader of that work, or None (read only)
    ...                        # the view's rate limit; then the handle (lifecycle.join / serve_cached)
    lead(key, call_id)         # after admission: claim the work, so identical calls join this one

A work's key is the endpoint, its user-visible inputs (canonical JSON) and what else its result depends
on: the version and checksum of the source it reads, and the models that score it. Nothing of the user
goes into it. The source's version is kept per process (workers.local_cache, dropped when a Source is
saved or deleted: workers.apps), since every call asks for it. Two Redis keys per work, under the lane prefix (capacity.keys): a claim naming the call that
runs it while it is open (SET NX, so one call leads across every API host), and a pointer to the call
whose result is warm. The leader's end gives the claim up and sets the pointer in one script
(workers.lifecycle.sharing.release_work).

Sharing never fails a call: without Redis, or on any error of its own, a call runs its own work.

Written by hand: Celery's result backend can't answer "is this work already queued or running", and a
cache in front of the views (Django's cache framework) would answer without a handle of the user's own.
"""
import hashlib
import json
import time
from dataclasses import dataclass

from capacity import failopen
from capacity.config import get_config
from capacity.constants import MATCH
from capacity.keys import warm_key, work_claim_key
from capacity.store import get_store
from workers import lifecycle
from workers.local_cache import SOURCE, LocalCache
from workers.lifecycle.sharing import claim_ms
from workers.models import OPEN_STATES, HeavyCall, ServedAs, State

LEADER_ROW_WAIT_SECONDS = 5.0  # a leader claims its work just before it commits its row
SOURCE_VERSIONS = LocalCache(SOURCE)  # target_repo_url -> concepts.services.source_version of it


def work_key(endpoint, payload, semantic=False, reranker=False):
    """sha256 of everything a call's result depends on (see the module docstring)."""
    from concepts import services
    body = payload.get('body', payload) if isinstance(payload, dict) else payload
    url = body.get('target_repo_url') if endpoint == MATCH and isinstance(body, dict) else None
    canonical = json.dumps({
        'endpoint': endpoint, 'semantic': bool(semantic), 'reranker': bool(reranker), 'payload': payload,
        'source': SOURCE_VERSIONS.get(url, lambda: services.source_version(url)) if url else None,
        'embedder': services.embedder_name() if semantic else None,
        'reranker_model': services.reranker_name() if reranker or endpoint != MATCH else None,
    }, sort_keys=True, separators=(',', ':'), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Found:
    """Identical work that can serve a new call: `call` is the leader to join, or the succeeded call whose
    result answers it (`served_as` says which)."""

    served_as: ServedAs
    call: HeavyCall


def find(key, config=None):
    """The open leader or the warm result of the work `key`, or None (this call runs the work itself).

    Reads only. A claim whose call succeeded serves its result (its end, which turns the claim into the
    warm pointer, may not have run yet: that moment used to run the work a second time); a claim whose
    call ended otherwise (its end couldn't give the claim up) is given up here; a claim whose call's row
    isn't committed yet is waited for, up to LEADER_ROW_WAIT_SECONDS.
    """
    store = get_store()
    if not key or not store.is_available():
        return None
    config = config or get_config()
    ttl = config.cache.ttl_seconds
    claim = work_claim_key(key)
    deadline = time.monotonic() + LEADER_ROW_WAIT_SECONDS
    for _ in range(3):
        try:
            warm_id, leader_id = (_text(value) for value in store.command('mget', [warm_key(key), claim]))
        except Exception as ex:  # noqa: BLE001 - fail open: the call runs its own work
            failopen.record(None, ex, 'sharing lookup', store)
            return None
        if warm_id and ttl > 0:
            source = warm(warm_id, ttl)
            if source is not None:
                return Found(ServedAs.CACHED, source)
        if not leader_id:
            return None
        while (leader := HeavyCall.objects.filter(pk=leader_id).first()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if leader is not None and leader.state in OPEN_STATES and leader.work_key == key:
            return Found(ServedAs.COALESCED, leader)
        if leader is not None and leader.work_key == key and ttl > 0 and (source := warm(leader.pk, ttl)):
            # It succeeded and its end hasn't given the claim up yet (nor set the warm pointer): its result.
            return Found(ServedAs.CACHED, source)
        try:  # the claim outlived its call (or its call never committed): give it up, look again
            store.unclaim(claim, leader_id)
        except Exception as ex:  # noqa: BLE001
            failopen.record(None, ex, 'sharing unclaim', store)
            return None
    return None


def warm(call_id, ttl_seconds):
    """The succeeded call `call_id` when its result is still warm (it ended less than `ttl_seconds` ago:
    the config's TTL in force now, even if the pointer was set under a longer one) and stored."""
    from datetime import timedelta

    from django.utils import timezone
    source = HeavyCall.objects.filter(
        pk=call_id, state=State.SUCCEEDED, finished_at__gt=timezone.now() - timedelta(seconds=ttl_seconds)).first()
    if source is None or source.leader_id is not None or lifecycle.stored_result(source.pk) is None:
        return None
    return source


def attach(call, found):
    """Write `call` (a new, unsaved row) as served by `found`; None when the leader's work was cancelled
    as it joined (the caller looks again)."""
    if found.served_as == ServedAs.CACHED:
        return lifecycle.serve_cached(call, found.call)
    return lifecycle.join(call, found.call)


def lead(key, call_id, config=None):
    """Claim the work `key` for the call `call_id` (admitted, about to be enqueued); False when an
    identical call claimed it since `find` looked (the caller gives its leases back and joins that one).
    True, too, when sharing can't be used now: the call then runs its own work."""
    store = get_store()
    if not key or not store.is_available():
        return True
    try:
        ms = claim_ms(config or get_config())
        return bool(store.command('set', work_claim_key(key), call_id, nx=True, px=ms))
    except Exception as ex:  # noqa: BLE001 - fail open
        failopen.record(None, ex, 'sharing claim', store)
        return True


def abandon(key, call_id):
    """Give up the claim of a call that won't run after all (its enqueue failed, or lost an
    Idempotency-Key race): identical calls then run their own work."""
    store = get_store()
    if not key or not store.is_available():
        return
    try:
        store.unclaim(work_claim_key(key), call_id)
    except Exception as ex:  # noqa: BLE001 - the claim expires, and joiners find no row for it
        failopen.record(None, ex, 'sharing unclaim', store)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
