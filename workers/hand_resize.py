"""A lane worker's pool resized by hand (Flower's pool grow/shrink, `celery control pool_grow`) becomes the
lane's limit: one config change, source `flower`, so leases and pools stay one number.

The node's pool reconciler (workers.pool) tells a hand resize from its own: it knows what it asked for and
waits for it to land, and any other change of its pool's size is a hand resize. It then calls `adopt`:
the queue's new total pool size is the configured one plus the change on that node, turned back into the
config value that sizes the queue (`WorkQueue.sized_to`: `reserve_single_row` for interactive, `es2_knn`
for es2_knn, `api_heavy.cluster` for api_heavy), saved once with capacity.config.save_config. Every node
then re-splits the new total. A short Redis lock per queue keeps two nodes resized at the same moment from
saving over each other: the second waits for the next tick and adds its change to the first one's.

A config change that resized the queue's pool after the node was last sized from the config (a PATCH, the
management command, the lanes page) supersedes a hand resize not yet adopted: the change is what the staff
asked for last, and adding the hand change to it would give a number nobody asked for (a grow to 3 racing
`es2_knn=5` ended at 6). The hand resize is dropped (logged) and the node is re-sized from the new config.
Another node's adopted hand resize supersedes nothing: the two add up, as above. The adopted change is
saved only if the version it was computed from is still the newest (save_config's `based_on`), so a PATCH
landing between the two is never added to either.

Written by hand because Celery has no hook for a resize: the reconciler sees it in the pool's size.
"""
import logging
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError

from capacity.config import Superseded, get_current, save_config
from capacity.constants import SOURCE_FLOWER
from workers import lanes

logger = logging.getLogger('heavy_lanes')
BUSY, SAVED, REFUSED, SUPERSEDED = 'busy', 'saved', 'refused', 'superseded'


def lock_key(queue):
    return f'{settings.CAPACITY_KEY_PREFIX}:resize:{queue}'


def adopt(client, queue, node, before, after, sized_from=None, lock_seconds=10):
    """Make the hand resize of `node`'s pool for `queue` (`before` -> `after` processes) the lane's limit.

    `sized_from` is the config the node's pool was last sized from. Returns SAVED (the config now says
    so), BUSY (another node is saving one: try again next tick), SUPERSEDED (a newer config change resized
    the queue: the hand resize is dropped) or REFUSED (the config can't say so, e.g. a reserve above the
    cluster limit: logged, left as drift).
    """
    token = uuid.uuid4().hex
    if not client.set(lock_key(queue), token, nx=True, ex=max(int(lock_seconds), 1)):
        return BUSY
    try:
        work_queue = lanes.get_queue(queue)
        latest, config = get_current()  # not the cache: another node may have saved a resize a moment ago
        if (sized_from is not None and work_queue.pool_size(config) != work_queue.pool_size(sized_from)
                and latest is not None and latest.source != SOURCE_FLOWER):
            logger.info('Hand resize of %s on %s from %d to %d superseded by config version %s (%s pool %d -> %d)',
                        queue, node, before, after, latest.id if latest else None, queue,
                        work_queue.pool_size(sized_from), work_queue.pool_size(config))
            return SUPERSEDED
        total = work_queue.pool_size(config) + (after - before)
        change = work_queue.sized_to(total, config)
        verb = 'grown' if after > before else 'shrunk'
        note = (f'{node} pool {verb} by hand from {before} to {after} processes: {queue} pool '
                f'{work_queue.pool_size(config)} -> {total} ({work_queue.sized_by})')
        try:
            save_config(change, source=SOURCE_FLOWER, note=note, based_on=latest.id if latest else None)
        except Superseded:
            logger.info('Hand resize of %s on %s superseded by a config change saved meanwhile', queue, node)
            return SUPERSEDED
        except ValidationError as ex:
            logger.warning('Hand resize of %s on %s not made the limit (%s); it shows as drift', queue, node,
                           '; '.join(ex.messages))
            return REFUSED
        logger.info('Hand resize made the lane limit: %s', note)
        return SAVED
    finally:
        if client.get(lock_key(queue)) in (token, token.encode()):
            client.delete(lock_key(queue))
