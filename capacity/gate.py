"""The gate: take a lease in every lane a call applies to, decide, and say so as an Admission.

    admission = admit(user, endpoint='$match', rows=10, semantic=True, queue='es2_knn',
                      draws_on=Lane.ES2_KNN, facts=RequestFacts.from_meta(request.META), token=task_id)
    if admission.refused: ...   # 429 with refusal_body(admission) and headers(admission)
    else: enqueue, and the worker renews and releases admission.worker_lease(...)

`admit` runs the policy of capacity.decisions against the lane store and owns the fail-open rule: the
limiter never refuses because it failed itself; any error of its own makes the decision `unavailable` and
the call goes ahead uncounted (capacity.failopen). Client input reaches it already parsed
(capacity.caller.RequestFacts), so nothing a client sends can make it fail. In `off` mode nothing is
counted: the decision is None, with no headers and no log line.

A request that waits for a call's result (a waiting POST, a long poll) is admitted the same way, with
`wait_slot=True`: it takes a slot in this API host's lane alone, never forced, so the host's cap holds in
shadow mode too; with the `endpoint` and `rows` of the call it waits for, so a single-row call's request may
use the single-row reserve there and a bulk call's may not.
"""
import dataclasses
import uuid

from django.conf import settings

from capacity import decisions, failopen, plans
from capacity.admission import Admission, LaneState
from capacity.caller import NO_FACTS, get_tier
from capacity.config import get_config
from capacity.constants import OFF, Decision
from capacity.store import Unknown, get_store


def admit(user, endpoint='', rows=0, semantic=False, reranker=False, waits=False, queue='', draws_on=None,
          wait_slot=False, facts=NO_FACTS, token=None, lease_ms=None, config=None, store=None):
    """Admit one call (see the module docstring). Never raises."""
    config = config or get_config()
    token = token or uuid.uuid4().hex
    if config.mode == OFF:
        return Admission(decision=None, token=token, mode=OFF, facts=facts)
    store = store or get_store()
    # This runs on every heavy call's way (bench/admission.py): each object is built once on the admitted
    # path (the lanes, keys and limits once per config: capacity.plans), and what a failure reports is built
    # only when one happens, from what was known by then.
    call = lanes = keys = acquired = None
    enforced = False
    try:
        call = decisions.Call(
            endpoint=endpoint, rows=rows, tier=get_tier(user), user_id=getattr(user, 'pk', None),
            semantic=bool(semantic), reranker=bool(reranker), waits=bool(waits), host=settings.CAPACITY_TASK_ID,
            queue=queue, draws_on=draws_on, wait_slot=wait_slot)
        enforced = wait_slot or decisions.is_enforced(config, facts.aware)
        plan = plans.plan_for(config, call, enforced)
        lanes, keys = plan.lanes, plan.keys
        if lease_ms is None:
            lease_ms = (config.queue.deadline_seconds if queue else config.lease_seconds) * 1000
        acquired = store.acquire(keys, plan.limits, token, lease_ms, force=not enforced)
        if isinstance(acquired, Unknown):
            # Never refuse on the limiter's own failure: the call goes ahead uncounted. An acquire whose
            # answer never came is taken back by the store once Redis answers (it may still run it).
            return with_suggested(_uncounted(token, call, config, enforced, lanes, keys, lease_ms, facts,
                                             acquired.error))
        decision, full = decisions.decide(lanes, acquired.counts, acquired.taken)
        taken = int(acquired.taken)
        counted = tuple([LaneState(item.lane, key, item.limit, count + taken)
                         for item, key, count in zip(lanes, keys, acquired.counts)])
        retry = (decisions.retry_after(config, lanes, acquired.counts, full, acquired.holds)
                 if decision in (Decision.SHADOW_REFUSED, Decision.REFUSED) else None)
        suggested, error = None, None
        try:
            suggested = decisions.suggested_concurrency(
                plan.lane_limits, {state.lane: state.count for state in counted})
        except Exception as ex:  # noqa: BLE001 - a header must never fail the call
            error = failopen.record(ex, 'suggested concurrency')
        return Admission(
            decision=decision, token=token, call=call, mode=config.mode, enforced=enforced, lanes=counted,
            full=full, holding=acquired.taken, lease_ms=lease_ms,
            acquired_ms=acquired.acquired_ms if acquired.taken else 0, facts=facts, retry_after=retry,
            suggested=suggested, error=error)
    except Exception as ex:  # noqa: BLE001 - a bug in the policy never refuses a call either
        error = failopen.record(ex, 'admission', store)
        if call is None:
            call = decisions.Call(
                endpoint=endpoint, rows=rows, tier=None, user_id=getattr(user, 'pk', None),
                semantic=bool(semantic), reranker=bool(reranker), waits=bool(waits),
                host=settings.CAPACITY_TASK_ID, queue=queue, draws_on=draws_on, wait_slot=wait_slot)
        # Never refuse on the limiter's own failure: the call goes ahead uncounted. Leases it took before
        # the failure stay in its admission, so they are released like any other call's.
        return with_suggested(_uncounted(token, call, config, enforced, lanes, keys, lease_ms, facts, error,
                                         acquired))


def _uncounted(token, call, config, enforced, lanes, keys, lease_ms, facts, error, acquired=None):
    """The `unavailable` Admission of a call the limiter skipped or failed on; `acquired`: what an acquire
    that did answer took (a failure after it)."""
    holding = bool(acquired is not None and acquired.taken)
    return Admission(
        decision=Decision.UNAVAILABLE, token=token, call=call, mode=config.mode, enforced=enforced,
        lanes=tuple(LaneState(item.lane, key, item.limit) for item, key in zip(lanes or (), keys or ())),
        holding=holding, lease_ms=lease_ms or 0, acquired_ms=acquired.acquired_ms if holding else 0,
        facts=facts, error=error)


def unadmitted(user, decision, endpoint='', rows=0, semantic=False, reranker=False, waits=False, queue='',
               draws_on=None, facts=NO_FACTS, token=None, config=None, store=None):
    """The Admission of a call served without admission (`decision` COALESCED or CACHED: it shares an
    identical call's work, workers.sharing): no lane, no lease, but the suggested concurrency a client sizes
    its run by, from the lanes a call of its kind takes as they are counted now (`suggested_now`); decision
    None when the limiter is off, as for every call then (no headers, no log line). Never raises."""
    config = config or get_config()
    token = token or uuid.uuid4().hex
    if config.mode == OFF:
        return Admission(decision=None, token=token, mode=OFF, facts=facts)
    call = decisions.Call(
        endpoint=endpoint, rows=rows, tier=get_tier(user), user_id=getattr(user, 'pk', None),
        semantic=bool(semantic), reranker=bool(reranker), waits=bool(waits), host=settings.CAPACITY_TASK_ID,
        queue=queue, draws_on=draws_on)
    admission = Admission(decision=decision, token=token, call=call, mode=config.mode,
                          enforced=decisions.is_enforced(config, facts.aware), facts=facts)
    return suggested_now(admission, config, store)


def suggested_now(admission, config, store=None):
    """`admission` (a call that took no lease) with the suggested concurrency of the lanes a call of its
    kind takes, counted now: one read, nothing taken. When Redis can't count them, the suggestion of the
    limits alone (the per-user limit), as for an `unavailable` call; a failure is recorded, never raised."""
    try:
        plan = plans.plan_for(config, admission.call, admission.enforced)
        counts = (store or get_store()).count(list(plan.keys))
        # Unknown: the store has recorded why (capacity.failopen); the suggestion falls back to the limits.
        counted = {} if isinstance(counts, Unknown) else {item.lane: count for item, count in zip(plan.lanes, counts)}
        return _replace(admission, suggested=decisions.suggested_concurrency(plan.lane_limits, counted))
    except Exception as ex:  # noqa: BLE001 - a header must never fail the call
        return admission.with_error(failopen.record(ex, 'suggested concurrency'))


def _replace(admission, **changes):
    return dataclasses.replace(admission, **changes)


def with_suggested(admission):
    """The admission with its suggested concurrency; a failure there is recorded, never raised."""
    try:
        return _replace(admission, suggested=decisions.suggested_concurrency(admission.limits, admission.counts))
    except Exception as ex:  # noqa: BLE001 - a header must never fail the call
        return admission.with_error(failopen.record(ex, 'suggested concurrency'))


def release(admission, store=None):
    """Give back every lease `admission` took (a call that ends in the API: not enqueued, or in tests);
    returns what the limiter met, or None."""
    lease = admission.lease(store)
    lease.release()
    return lease.error

