"""The one way a work's state changes: a guarded UPDATE named in workers.models.TRANSITIONS.

    moved = move('start', work.pk, started_at=now, worker=worker)   # 1 when it was queued, else 0

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
