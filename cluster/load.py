"""The load generator of the client host: client threads through the proxy, as the issue's users are.

- waiting clients: a `$match` without `Prefer: respond-async` (they wait in the request, `Prefer: wait=30`),
  answered 200 with `Content-Location: /tasks/<id>/` or 202 with the handle when the wait ran out;
- polling clients: `Prefer: respond-async`, then `GET /tasks/<id>/` until the call ended; one call in
  `CANCEL_EVERY` is cancelled (`DELETE`) after a short while;
- single-row (the interactive queue) and bulk calls (es2_knn), semantic.

Every answer is kept (`Submission`): what was sent, when, its status and the handle it got, so the checks
can ask of every handle a client got whether its call reached a final state.
"""
import itertools
import random
import threading
import time
from dataclasses import dataclass, field

import requests

TERMS = ['high blood pressure', 'sugar diabetes', 'heart attack', 'fever', 'head ache', 'chest pain',
         'migraine', 'asthma', 'kidney stones', 'broken arm', 'cough', 'rash', 'nausea', 'back pain']
FINAL = ('succeeded', 'failed', 'cancelled', 'expired')
CANCEL_EVERY = 7
SOURCE = '/orgs/HL/sources/TinyClinical/'


@dataclass
class Submission:
    client: int
    kind: str  # waiting / polling
    rows: int
    sent: float  # time.time()
    took: float = 0.0
    status: int = 0
    call_id: str | None = None
    error_code: str | None = None
    error: str | None = None
    cancelled: bool = False
    polls: list = field(default_factory=list)


class Load:
    def __init__(self, url, tokens, waiting=2, polling=4, pause=0.3, bulk_rows=1000):
        self.url, self.tokens = url, tokens
        self.kinds = ['waiting'] * waiting + ['polling'] * polling
        self.pause, self.bulk_rows = pause, bulk_rows
        self.submissions = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = []

    def start(self):
        self.stopping.clear()
        self.threads = [threading.Thread(target=self.run, args=(i, kind), daemon=True, name=f'load-{i}')
                        for i, kind in enumerate(self.kinds)]
        for thread in self.threads:
            thread.start()
        return self

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)

    def handles(self, since=0.0):
        with self.lock:
            return [s for s in self.submissions if s.call_id and s.sent >= since]

    def run(self, index, kind):
        chooser = random.Random(index * 7919 + int(time.time()))
        session = requests.Session()
        token = self.tokens[index % len(self.tokens)]
        for n in itertools.count():
            if self.stopping.is_set():
                break
            rows = 1 if n % 2 else self.bulk_rows
            body = {'rows': [{'name': f'{chooser.choice(TERMS)} {chooser.randrange(10**6)}'} for _ in range(rows)],
                    'target_repo_url': SOURCE}
            submission = Submission(client=index, kind=kind, rows=rows, sent=time.time())
            headers = {'Authorization': f'Token {token}',
                       'Prefer': 'respond-async' if kind == 'polling' else 'wait=30'}
            try:
                response = session.post(f'{self.url}/concepts/$match/?semantic=true&limit={5 if rows == 1 else 20}',
                                        json=body,
                                        headers=headers, timeout=45)
                submission.status = response.status_code
                location = response.headers.get('Content-Location') or response.headers.get('Location') or ''
                if '/tasks/' in location:
                    submission.call_id = location.rstrip('/').rsplit('/', 1)[-1]
                if response.status_code >= 400:
                    try:
                        submission.error_code = response.json().get('error_code')
                    except ValueError:
                        submission.error_code = response.text[:80]
            except requests.RequestException as ex:
                submission.error = f'{type(ex).__name__}'
            submission.took = time.time() - submission.sent
            with self.lock:
                self.submissions.append(submission)
            if kind == 'polling' and submission.call_id:
                self.follow(session, headers, submission, cancel=(n % CANCEL_EVERY == 3))
            wait = max(self.pause, 1.0) if submission.status in (429, 503) or submission.error else self.pause
            self.stopping.wait(wait * (0.5 + chooser.random()))
        session.close()

    def follow(self, session, headers, submission, cancel):
        started = time.time()
        while not self.stopping.is_set() and time.time() - started < 120:
            if cancel and time.time() - started > 0.5 and not submission.cancelled:
                try:
                    session.delete(f'{self.url}/tasks/{submission.call_id}/', headers=headers, timeout=15)
                    submission.cancelled = True
                except requests.RequestException:
                    pass
            try:
                answer = session.get(f'{self.url}/tasks/{submission.call_id}/', headers=headers, timeout=15)
                state = answer.json().get('state') if answer.status_code == 200 else f'http {answer.status_code}'
            except (requests.RequestException, ValueError):
                state = 'error'
            submission.polls.append(state)
            if state in FINAL:
                return
            self.stopping.wait(0.5)
