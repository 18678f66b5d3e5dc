"""The soak's samplers (bench/soak.py): every lane's in-flight count, read from the lanes Redis every
SAMPLE_SECONDS, so the soak can tell over-admission from the fail-open windows; and a watch on the rows for
calls left queued past their deadline."""
import threading
import time

SAMPLE_SECONDS = 0.05


class Sampler(threading.Thread):
    """In-flight per lane key every 50 ms from the lanes Redis; skips samples while `hung` is set."""

    def __init__(self, url, tag, limit_of, known, hung):
        super().__init__(name='soak-sampler', daemon=True)
        import redis
        self.client = redis.Redis.from_url(url, socket_timeout=0.2, socket_connect_timeout=0.2)
        self.tag, self.limit_of, self.known, self.hung = tag, limit_of, list(known), hung
        self.stop_event = threading.Event()
        self.samples = []   # (t, {key: count})
        self.skipped = 0    # during the hang (not attempted)
        self.failed = 0     # attempted, Redis did not answer in time
        self.started = None
        self.error = None

    def run(self):
        try:
            self._run()
        except Exception as ex:  # noqa: BLE001 - reported as a failed check
            self.error = f'{type(ex).__name__}: {ex}'

    def _run(self):
        import redis
        keys, keys_at = list(self.known), 0.0
        self.started = time.monotonic()
        next_at = self.started
        while not self.stop_event.is_set():
            now = time.monotonic()
            if self.hung.is_set():
                self.skipped += 1
            else:
                try:
                    if now - keys_at >= 1.0:
                        found = {k.decode() for k in self.client.scan_iter(match=self.tag + '*', count=1000)
                                 if b':stats:' not in k}
                        keys, keys_at = sorted(set(self.known) | found), now
                    seconds, micros = self.client.time()
                    now_ms = seconds * 1000 + micros // 1000
                    pipe = self.client.pipeline(transaction=False)
                    for key in keys:
                        pipe.zcount(key, f'({now_ms}', '+inf')
                    counts = dict(zip(keys, pipe.execute()))
                    self.samples.append((round(time.monotonic() - self.started, 3), counts))
                except redis.RedisError:
                    self.failed += 1
            next_at += SAMPLE_SECONDS
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def stop(self):
        self.stop_event.set()
        self.join(5)


class Watch(threading.Thread):
    """Every second: any call still `queued` `late_seconds` past its deadline (one the sweep missed)."""

    def __init__(self, late_seconds):
        super().__init__(name='soak-watch', daemon=True)
        self.late_seconds = late_seconds
        self.stopping = threading.Event()
        self.late = {}  # call id -> (expires_at, seen at)
        self.errors = 0

    def run(self):
        from datetime import timedelta

        from django.db import connection
        from django.utils import timezone

        from workers.models import Work
        try:
            while not self.stopping.wait(1.0):
                try:
                    cutoff = timezone.now() - timedelta(seconds=self.late_seconds)
                    for pk, expires in Work.objects.filter(state='queued', expires_at__lt=cutoff).values_list(
                            'pk', 'expires_at'):
                        self.late.setdefault(pk, (expires.isoformat(), timezone.now().isoformat()))
                except Exception:  # noqa: BLE001 - a database fault: look again in a second
                    self.errors += 1
                    connection.close()
        finally:
            connection.close()

    def stop(self):
        self.stopping.set()
        self.join(5)
