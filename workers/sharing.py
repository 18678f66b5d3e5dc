"""The same work runs once: an identical call joins an open work (singleflight), and a succeeded work's
result answers identical calls for `cache.ttl_seconds` (a warm result), without admission.

    key = work_key(MATCH, payload, owner, semantic=True)   # the same work, the same key
    found = find(key)          # an open work to join, or a succeeded one whose result is warm, or None
    ...                        # the handle: workers.lifecycle.join / serve_cached
    lead(key, work_id)         # after admission: claim the work, so identical calls join this one

A work's key is the endpoint, its user-visible inputs (canonical JSON) and what else its result depends
on: the version and checksum of the source it reads, and the models that score it. Unless
HEAVY_LANES_SHARE_ACROSS_USERS is on, the key also holds the caller, so only one user's own identical calls
share (what one user sent is never visible to another as a `coalesced` or `cached` call). The source's
version is kept per process (workers.local_cache, dropped when a Source is saved or deleted).

The Redis half, all of it here, through the lane store's verbs (capacity.store): a claim naming the open
work of a key (`…:claim:work:<key>`, so one work leads across every API host) and a pointer to the
succeeded work whose result is warm (`…:warm:<key>`); a work's end gives the claim up and sets the pointer
in one script (`work_release`, with its leases' release: capacity.store.LaneStore.release_and_end).
Sharing never fails a call: without Redis, or on any error, a call runs its own work.

Written by hand: Celery's result backend can't answer "is this work already queued or running", and a
cache in front of the views (Django's cache framework) would answer without a handle of the user's own.
"""
import hashlib
import json
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from capacity.config import get_config, time_limits
from capacity.constants import MATCH
from capacity.keys import warm_key, work_claim_key
from capacity.store import Unknown, get_store
from workers.local_cache import SOURCE, LocalCache
from workers.models import OPEN_STATES, ServedAs, State, Work

WORK_ROW_WAIT_SECONDS = 5.0  # a work is claimed just before its row is committed
CLAIM_SLACK_SECONDS = 30     # a work's claim outlives the longest it can stay open by this much
SOURCE_VERSIONS = LocalCache(SOURCE)  # target_repo_url -> concepts.services.source_version of it


def work_key(endpoint, payload, owner_id=None, semantic=False, reranker=False):
    """sha256 of everything a call's result depends on (see the module docstring)."""
    from concepts import services
    body = payload.get('body', payload) if isinstance(payload, dict) else payload
    url = body.get('target_repo_url') if endpoint == MATCH and isinstance(body, dict) else None
    canonical = json.dumps({
        'endpoint': endpoint, 'semantic': bool(semantic), 'reranker': bool(reranker), 'payload': payload,
        'source': SOURCE_VERSIONS.get(url, lambda: services.source_version(url)) if url else None,
        'embedder': services.embedder_name() if semantic else None,
        'reranker_model': services.reranker_name() if reranker or endpoint != MATCH else None,
        'owner': None if settings.HEAVY_LANES_SHARE_ACROSS_USERS else owner_id,
    }, sort_keys=True, separators=(',', ':'), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def claim_ms(config):
    """How long a work's claim lives: past the longest the work can stay open, queued then running."""
    return int((config.queue.deadline_seconds + time_limits(config).hard + CLAIM_SLACK_SECONDS) * 1000)


@dataclass(frozen=True)
class Found:
    """Identical work that can serve a new call: `work` is open (the call joins it) or succeeded within the
    TTL (its result answers the call); `served_as` says which."""

    served_as: ServedAs
    work: Work


def find(key, config=None):
    """The open work or the warm result of the key `key`, or None (this call runs the work itself).

    Reads only. A claim whose work succeeded serves its result (its end, which turns the claim into the warm
    pointer, may not have run yet); a claim whose work ended otherwise (its end couldn't give the claim up)
    is given up here; a claim whose work's row isn't committed yet is waited for, up to
    WORK_ROW_WAIT_SECONDS.
    """
    if not key:
        return None
    config = config or get_config()
    ttl = config.cache.ttl_seconds
    store = get_store()
    deadline = time.monotonic() + WORK_ROW_WAIT_SECONDS
    for _ in range(3):
        held = store.read(warm_key(key), work_claim_key(key))
        if not held:
            return None  # Redis can't say: run it
        warm_id, open_id = held
        if warm_id and ttl > 0 and (work := warm(warm_id, ttl)) is not None:
            return Found(ServedAs.CACHED, work)
        if not open_id:
            return None
        while (work := Work.objects.filter(pk=open_id).first()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if work is not None and work.work_key == key:
            if work.state in OPEN_STATES:
                return Found(ServedAs.COALESCED, work)
            if ttl > 0 and warm(work.pk, ttl) is not None:
                return Found(ServedAs.CACHED, work)
        if isinstance(store.unclaim(work_claim_key(key), open_id), Unknown):
            return None  # it outlived its work, and couldn't be given up: run this call's own

    return None


def warm(work_id, ttl_seconds):
    """The succeeded work `work_id` when its result is still warm: it ended less than `ttl_seconds` ago (the
    config's TTL in force now, even if the pointer was set under a longer one). Its result is stored: the
    success wrote both in one transaction, and retention deletes both together."""
    return Work.objects.filter(pk=work_id, state=State.SUCCEEDED,
                               finished_at__gt=timezone.now() - timedelta(seconds=ttl_seconds)).first()


def lead(key, work_id, config=None):
    """Claim the key `key` for the work `work_id` (admitted, about to be enqueued); False when an identical
    call claimed it since `find` looked (the caller gives its leases back and joins that one). True, too,
    when Redis can't say: the call then runs its own work."""
    if not key:
        return True
    taken = get_store().claim(work_claim_key(key), work_id, claim_ms(config or get_config()))
    return taken is not False


def abandon(key, work_id):
    """Give up the claim of a work that won't run after all (its enqueue failed, or lost an
    Idempotency-Key race): identical calls then run their own work. Best effort: the claim expires, and
    `find` gives up a claim of a work that has no row."""
    if key:
        get_store().unclaim(work_claim_key(key), work_id)


def work_release(work):
    """The arguments of a work's release at its end (capacity.operations.Operations.release_and_end's
    `work`): its claim given up and, when it succeeded, its result warm for `cache.ttl_seconds`; None for a
    work no call can share."""
    if not work.work_key:
        return None
    ttl = get_config().cache.ttl_seconds if work.state == State.SUCCEEDED else 0
    return work_claim_key(work.work_key), work.pk, warm_key(work.work_key), int(ttl * 1000)


def release_work(work):
    """`work_release` on its own (an end with no leases to release along). A failure only costs sharing:
    the claim expires by itself, and `find` gives up a claim of a work that ended."""
    release = work_release(work)
    if release is not None:
        claim, token, pointer, pointer_ms = release
        get_store().unclaim(claim, token, pointer, pointer_ms)
