"""What the fault tests that put a stack under load share: client threads that keep submitting heavy calls
and record what each submission was answered and when, and the checks a user would make afterwards (every
call ended, none ran twice, no lease left, no lane let past its limit)."""
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import requests

from tests.integration.calls import distinct
from workers.models import Work

FINAL = ('succeeded', 'failed', 'cancelled', 'expired')
TERMS = ['high blood pressure', 'sugar diabetes', 'heart attack', 'fever', 'head ache', 'chest pain',
         'migraine', 'asthma', 'kidney stones', 'broken arm']


@dataclass
class Answer:
    """One submission as its client saw it: when it was sent and answered (time.monotonic() and the wall
    clock), the status, the capacity decision header, the call id (202) or error code (429, 503)."""

    client: int
    sent: float
    took: float
    sent_at: float
    status: int = 0
    decision: str | None = None
    call_id: str | None = None
    error_code: str | None = None
    error: str | None = None  # no HTTP answer at all (a timeout, a reset)


class Load:
    """`clients` threads, each its own user, submitting bulk semantic `$match` calls (a work of their own,
    `Prefer: respond-async`) to the API URLs in turn until stopped; a 429 makes its client wait out a short
    Retry-After. `answers` holds every submission."""

    def __init__(self, urls, tokens, source, pause=0.05, rows=3, timeout=30):
        self.urls, self.tokens, self.source = urls, tokens, source
        self.pause, self.rows, self.timeout = pause, rows, timeout
        self.answers = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), name=f'load-{i}', daemon=True)
                        for i in range(len(tokens))]

    def start(self):
        for thread in self.threads:
            thread.start()
        return self

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(self.timeout + 5)

    def run(self, index):
        urls = itertools.cycle(self.urls[index % len(self.urls):] + self.urls[:index % len(self.urls)])
        session = requests.Session()
        chooser = random.Random(index)
        while not self.stopping.is_set():
            rows = distinct([{'name': chooser.choice(TERMS)} for _ in range(self.rows)])
            answer = self.submit(session, next(urls), index, rows)
            with self.lock:
                self.answers.append(answer)
            wait = self.pause
            if answer.status == 429:
                wait = max(wait, 0.2)
            self.stopping.wait(wait)
        session.close()

    def submit(self, session, url, index, rows):
        sent, sent_at = time.monotonic(), time.time()
        answer = Answer(client=index, sent=sent, took=0.0, sent_at=sent_at)
        try:
            response = session.post(f'{url}/concepts/$match/?semantic=true', json={
                'rows': rows, 'target_repo_url': self.source},
                headers={'Authorization': f'Token {self.tokens[index]}', 'Prefer': 'respond-async'},
                timeout=self.timeout)
        except requests.RequestException as ex:
            answer.took, answer.error = time.monotonic() - sent, f'{type(ex).__name__}: {ex}'
            return answer
        answer.took = time.monotonic() - sent
        answer.status = response.status_code
        answer.decision = response.headers.get('X-OCL-Capacity-Decision')
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code == 202:
            answer.call_id = body.get('id')
        elif isinstance(body, dict):
            answer.error_code = body.get('error_code')
        return answer

    def accepted(self):
        return [answer for answer in self.answers if answer.status == 202]


def capacity_lines(processes):
    """Every `ocl_capacity` line the processes (Worker or Child objects) printed, as dicts."""
    lines = []
    for process in processes:
        for text in process.output().splitlines():
            if text.startswith('{') and '"ocl_capacity"' in text:
                try:
                    record = json.loads(text)
                except ValueError:
                    continue  # half a line: its process was killed while writing it
                if record.get('event') == 'ocl_capacity':
                    lines.append(record)
    return lines


def open_calls(ids):
    return list(Work.objects.filter(pk__in=ids).exclude(state__in=FINAL).values_list('pk', 'state'))


def wait_all_ended(ids, timeout, late_seconds):
    """Wait until every call of `ids` has ended, failing as soon as one is still `queued` `late_seconds`
    after its deadline (the sweep ends such a call within one of its intervals) or `timeout` has passed."""
    from django.utils import timezone
    deadline = time.monotonic() + timeout
    while open_calls(ids):
        late = Work.objects.filter(pk__in=ids, state='queued',
                                        expires_at__lt=timezone.now() - timedelta(seconds=late_seconds))
        assert not late.exists(), f'queued past the deadline: {list(late.values("pk", "expires_at"))}'
        assert time.monotonic() < deadline, f'calls still open: {open_calls(ids)}'
        time.sleep(0.2)


def over_admissions(calls, slack_seconds=0.5):
    """Calls counted in a lane (decision `admitted`, holding leases) while the lane already held its limit
    of other counted calls that were still open, from the rows alone: each call (a workers.models.Call)
    holds its lanes from its row's `created_at` (after admission) to its work's `finished_at` (after the
    release) less `slack_seconds`, a span inside the one in which it truly held them, so an overlap found
    here happened.

    Returns [(lane key, limit, call ids open at once)] for each excess found.
    """
    spans = {}  # lane key -> [(start, end, call id)]
    limits = {}
    for call in calls:
        admission = call.admission or {}
        counted = admission.get('decision') == 'admitted' and admission.get('holding')
        if not counted or call.work.finished_at is None:
            continue
        end = call.work.finished_at - timedelta(seconds=slack_seconds)
        for lane, key, limit, _count in admission.get('lanes') or ():
            if lane == 'api_heavy_task':
                continue  # the waiting requests' lane, not a call's
            limits[key] = int(limit)
            if end > call.created_at:
                spans.setdefault(key, []).append((call.created_at, end, call.pk))
    excess = []
    for key, items in spans.items():
        for start, _end, _call_id in items:
            holding = [other for s, e, other in items if s <= start < e]
            if len(holding) > limits[key]:
                excess.append((key, limits[key], sorted(holding)))
    return excess
