"""The one way a work's state changes: a guarded UPDATE named in workers.models.TRANSITIONS.

    moved = move('start', work.pk, started_at=now, worker=worker)   # 1 when it was queued, else 0
    moved = move_all('cancel', [a.pk, b.pk], finished_at=now)        # how many were open

The WHERE clause holds the states the transition starts from (and any `guard`, e.g. the worker that must
still own the work), so of two racing transitions one wins and the other changes nothing and says so.
"""
from workers.models import TRANSITIONS, Work


def move(name, work_id, guard=None, **fields):
    """Make the transition `name` of the work `work_id` (setting `fields` too) if its state is one it
    starts from and `guard` (field lookups) holds; how many rows changed (0 or 1)."""
    transition = TRANSITIONS[name]
    works = Work.objects.filter(pk=work_id, state__in=transition.source)
    if guard:
        works = works.filter(**guard)
    return works.update(state=transition.target, **fields)


def move_all(name, work_ids, **fields):
    """`move` for many works in one UPDATE (no guard beyond the transition's states): how many changed."""
    transition = TRANSITIONS[name]
    return Work.objects.filter(pk__in=list(work_ids), state__in=transition.source).update(
        state=transition.target, **fields)
