"""The load generator's sampler of GET /capacity/status/ (staff token): the largest in-flight count seen
per lane (api_heavy, es2_knn, tier:<tier>, api_heavy_task:<host>, the busiest user) and the deepest
queue, over a run. A refused staff token stops the sampling; other failed samples are counted.
"""
import threading
import time

from heavy_lanes_client import errors


class Sampler:
    """Samples /capacity/status/ every `interval` s through `client` (a staff token's, which it closes when
    done) until `stop` is set; start `thread` to begin."""

    def __init__(self, client, interval, stop):
        self.client = client
        self.interval = interval
        self.stop = stop
        self.samples = 0
        self.errors = 0
        self.last_error = None
        self.note = None
        self.lanes = {}   # lane -> [max in flight, limit]
        self.depths = {}  # queue -> [max depth, pool]
        self.thread = threading.Thread(target=self._loop, name='heavy-lanes-load-sampler', daemon=True)

    def _keep(self, maxima, name, value, limit):
        if not isinstance(value, int):
            return
        entry = maxima.setdefault(name, [0, None])
        entry[0] = max(entry[0], value)
        entry[1] = limit if isinstance(limit, int) else entry[1]

    def take(self, status):
        """Keep the largest values of one /capacity/status/ answer."""
        for lane in ('api_heavy', 'es2_knn'):
            item = status.get(lane) or {}
            self._keep(self.lanes, lane, item.get('in_flight'), item.get('limit'))
        for tier, item in (status.get('tiers') or {}).items():
            self._keep(self.lanes, f'tier:{tier}', (item or {}).get('in_flight'), (item or {}).get('limit'))
        for host, item in (status.get('tasks') or {}).items():
            item = item or {}
            self._keep(self.lanes, f'api_heavy_task:{host}', item.get('in_flight'), item.get('limit'))
        users = [(item or {}).get('in_flight') for item in (status.get('users') or {}).values()]
        users = [value for value in users if isinstance(value, int)]
        if users:
            self._keep(self.lanes, 'user (busiest)', max(users), None)
        for queue, item in (status.get('queues') or {}).items():
            item = item or {}
            self._keep(self.depths, queue, item.get('depth'), item.get('pool'))
        self.samples += 1

    def _loop(self):
        try:
            next_at = time.monotonic()
            while not self.stop.is_set():
                try:
                    self.take(self.client.capacity_status())
                except errors.AuthError as ex:
                    self.note = f'sampling stopped: the staff token was refused ({ex.reason})'
                    return
                except errors.ClientError as ex:
                    self.errors += 1
                    self.last_error = ex.reason
                next_at += self.interval
                self.stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            self.client.close()

    def report_note(self):
        """What the report says about the sampling: why it stopped early, how many samples failed."""
        notes = [self.note] if self.note else []
        if self.errors:
            notes.append(f'{self.errors} samples failed (last: {self.last_error})')
        return '; '.join(notes) or None
