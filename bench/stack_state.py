"""What a running benchmark stack (bench/stack.py) looks like from outside: its pools, lanes, queues and calls,
read from its Redis and database, and putting its calls back to none. A mixin of `Stack`, which supplies
`redis`, `lanes` and `children`."""
import time

from devstack.processes import pids
from workers.lanes import QUEUE_NAMES


class StackError(RuntimeError):
    pass


class StackState:
    def pools(self):
        """{queue: pool processes} as each lane worker last published (workers.pool)."""
        from workers.pool import read_pools
        return {queue: sum(pool.get('processes', 0) for pool in read_pools(self.redis, queue).values())
                for queue in self.lanes}

    def serving(self):
        """{queue: pool processes of the nodes consuming it}: a node whose share is 0 (more nodes than the
        lane's pool) keeps its one process, idle, and doesn't count."""
        from workers.pool import read_pools
        return {queue: sum(pool.get('processes', 0) for pool in read_pools(self.redis, queue).values()
                           if pool.get('consuming')) for queue in self.lanes}

    def wait_pools(self, wanted, timeout=30, serving=False):
        """Wait until each lane's pool has the wanted number of processes ({queue: n}); with `serving`,
        counting only the nodes that consume the queue (`serving()`)."""
        read = self.serving if serving else self.pools
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            have = read()
            if all(have.get(queue) == n for queue, n in wanted.items()):
                return have
            time.sleep(0.2)
        raise StackError(f'pools are {read()}, wanted {wanted}')

    def pool_pids(self, queue):
        """The pids of the lane worker's pool processes now: the children of its main process. A pool that
        was grown forks its new processes a little later, and each loads the indexes on its first call."""
        main = self.children[f'worker-{queue}'].pid
        children = set()
        for pid in pids():
            try:
                with open(f'/proc/{pid}/stat') as handle:
                    fields = handle.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == main and fields[0] != 'Z':
                children.add(pid)
        return children

    def lane_keys(self):
        from django.conf import settings
        return sorted(key.decode() for key in self.redis.scan_iter(
            match='{' + settings.CAPACITY_KEY_PREFIX + '}:*', count=1000) if b':stats:' not in key)

    def in_flight(self):
        """{lane key: leases not yet expired}, read from the sorted sets with Redis's clock."""
        seconds, micros = self.redis.time()
        now_ms = seconds * 1000 + micros // 1000
        keys = self.lane_keys()
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.zcount(key, f'({now_ms}', '+inf')
        return dict(zip(keys, pipe.execute()))

    def queue_depths(self):
        """{queue: messages waiting in the broker}, over the plain list and every priority level."""
        pipe = self.redis.pipeline(transaction=False)
        names = [(queue, name) for queue in QUEUE_NAMES
                 for name in [queue] + [f'{queue}\x06\x16{level}' for level in (3, 6, 9)]]
        for _, name in names:
            pipe.llen(name)
        depths = dict.fromkeys(QUEUE_NAMES, 0)
        for (queue, _), depth in zip(names, pipe.execute()):
            depths[queue] += depth
        return depths

    def reset_calls(self, purge=True):
        """Forget every call: empty the queues and the lanes, give up the works' claims and warm results
        (a claim left to a deleted row makes an identical call wait for that row), delete the calls' rows
        and results."""
        from django.conf import settings
        from django.db import connection
        if purge:
            for queue in QUEUE_NAMES:
                for name in [queue] + [f'{queue}\x06\x16{level}' for level in (0, 3, 6, 9)]:
                    self.redis.delete(name)
        prefix = settings.CAPACITY_KEY_PREFIX
        for pattern in ('{' + prefix + '}:*', f'{prefix}:claim:work:*', f'{prefix}:warm:*'):
            for key in self.redis.scan_iter(match=pattern, count=1000):
                self.redis.delete(key)
        from django_celery_results.models import TaskResult

        from workers.models import Call, Work
        tables = ', '.join(model._meta.db_table for model in (Call, Work, TaskResult))
        with connection.cursor() as cursor:
            cursor.execute(f'TRUNCATE {tables}')

    def served_as(self, ids=None):
        """{served_as: calls} of the call rows (of `ids`, or all): `run` for a call whose own work ran."""
        from django.db.models import Count

        from workers.models import Call
        calls = Call.objects.all() if ids is None else Call.objects.filter(pk__in=list(ids))
        return {row['served_as']: row['n'] for row in calls.order_by().values('served_as').annotate(n=Count('id'))}

    def wait_drained(self, timeout=120):
        """Wait until no message waits in a queue and no work is queued or running."""
        from workers.models import State, Work
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(self.queue_depths().values()) and not Work.objects.filter(
                    state__in=(State.QUEUED, State.RUNNING)).exists():
                return True
            time.sleep(0.2)
        return False
