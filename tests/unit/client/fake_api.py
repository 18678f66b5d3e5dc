"""A scripted stand-in for the Heavy Lanes HTTP API, served on 127.0.0.1 from a thread.

It speaks the public contract (docs/client.md, DESIGN.md): 202 handles with Location, tasks that finish
after `task_seconds` (long-polled with ?wait=N), DELETE to cancel, capacity and rate-limit 429s, 5xx, and
Idempotency-Key replays per token. Tests script the next POST answers (`api.script.append(Refuse(...))`)
and read back every request it saw (`api.seen`), with the number of the caller's tasks still open when
each POST arrived.
"""
import json
import socket
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TIERS = {'t-core': 'core', 't-core2': 'core', 't-preview': 'preview', 't-staff': 'staff'}
FINAL = ('succeeded', 'failed', 'cancelled', 'expired')


# --- scripted answers to the next POSTs ---------------------------------------------------------------

@dataclass
class Accept:
    """Take the call (202): the default."""


@dataclass
class Refuse:
    retry_after: int = 1
    scope: str = 'es2_knn'
    paused: bool = False
    suggested: int | None = None


@dataclass
class RateLimit:
    retry_after: int = 1


@dataclass
class Error:
    status: int = 503
    code: str = 'queue_unavailable'


@dataclass
class EndedFailed:
    """Take the call, which fails within the submission's wait: the in-request 400, and Content-Location."""

    error: str = 'rows[0].name: a bad row'


@dataclass
class Invalid:
    fields: dict = field(default_factory=lambda: {'target_repo_url': ['Unknown source.']})


@dataclass
class Drop:
    """Close the connection without answering; `admit` takes the call first (the server did the work)."""

    admit: bool = False


@dataclass
class Trickle:
    """Answer one header byte every `every` s until the test ends: never finishes, never times out."""

    every: float = 0.2


@dataclass
class Seen:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case names
    body: object
    at: float
    open_before: int | None = None  # the caller's open tasks when a POST arrived
    answer: int | None = None


@dataclass
class FakeTask:
    id: str
    token: str
    key: str | None
    endpoint: str
    lane: str
    semantic: bool
    body: dict
    created: float
    finish_at: float | None  # None: held until cancelled
    final_state: str
    state: str = 'queued'
    error: str | None = None


class FakeApi:
    def __init__(self):
        self.cond = threading.Condition()
        self.seen = []
        self.script = deque()
        self.default = Accept()
        self.tasks = {}
        self.keys = {}
        self.suggested = None          # None: no capacity headers (limiter off); int, or callable(api, token)
        self.task_seconds = 0.05
        self.final_states = deque()    # final states of the next tasks; then 'succeeded'
        self.hold_tasks = False        # tasks run until cancelled
        self.rows_done = None          # int: a running task's `progress` says this many of its rows are done
        self.poll_hint = 1
        self.long_poll_cap = 5.0       # seconds a ?wait=N poll may be held (0: ignore ?wait)
        self.no_match = set()          # row names that get no candidates
        self.short_results = False     # a succeeded result that leaves out the last row
        self.per_token_limit = {}      # token -> open tasks allowed; beyond: 429 capacity (enforce)
        self.refuse_retry_after = 1
        self.wire_format = True        # OCL's answers (the real server's); False: the shape of servers before it
        self.standard_only = False     # capacity in the IETF RateLimit fields alone, no X-OCL-Capacity-*
        self.max_open = 0
        self.max_open_lane = Counter()
        self.closing = threading.Event()
        self.server = ThreadingHTTPServer(('127.0.0.1', 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={'poll_interval': 0.05},
                                       name='fake-heavy-lanes-api', daemon=True)

    @property
    def url(self):
        return f'http://127.0.0.1:{self.server.server_address[1]}'

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.closing.set()
        with self.cond:
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    # --- views of what happened ------------------------------------------------------------------------

    def requests(self, method=None, prefix=''):
        with self.cond:
            return [seen for seen in self.seen if (method is None or seen.method == method)
                    and seen.path.startswith(prefix)]

    def posts(self):
        return self.requests('POST', '/concepts/')

    def wait_for(self, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.cond:
                if predicate(self):
                    return True
            time.sleep(0.01)
        return False

    # --- task lifecycle (lazy: a task's state follows the clock) -------------------------------------------

    def _advance(self, now=None):
        now = time.monotonic() if now is None else now
        for task in self.tasks.values():
            if task.state in FINAL:
                continue
            if task.state == 'queued' and now >= task.created + 0.001:
                task.state = 'running'
            if task.finish_at is not None and now >= task.finish_at:
                task.state = task.final_state
                if task.final_state == 'failed':
                    task.error = 'The worker failed: scripted failure.'
                elif task.final_state == 'expired':
                    task.error = 'The call waited in its queue past its deadline and was not run.'

    def open_tasks(self, token=None, lane=None):
        self._advance()
        return [task for task in self.tasks.values() if task.state not in FINAL
                and (token is None or task.token == token) and (lane is None or task.lane == lane)]

    def _result(self, task):
        """The answer in OCL's wire format, as the real server gives it (or, without `wire_format`, in the
        shape of servers before it, which the client still reads)."""
        if task.endpoint == '$rerank':
            key = task.body.get('score_key') or 'search_rerank_score'
            rows = [dict(row, **{key: round(1.0 / (i + 1), 4)}) for i, row in enumerate(task.body['rows'])]
            return rows if self.wire_format else {'q': task.body['q'], 'rows': rows, 'algorithm': 'rerank:fake'}
        rows = task.body['rows'][:-1] if self.short_results else task.body['rows']
        answer = []
        for row in rows:
            name = row['name']
            code = f'HP:{abs(hash(name)) % 10 ** 7:07d}'
            if not self.wire_format:
                answer.append({'row': row, 'candidates': [] if name in self.no_match else [
                    {'code': code, 'name': name.title(), 'concept_class': 'Phenotype', 'score': 0.9,
                     'matched': name}]})
                continue
            results = [] if name in self.no_match else [
                {'id': code, 'type': 'Concept', 'url': f'/orgs/HPO/sources/HPO/concepts/{code}/',
                 'display_name': name.title(), 'retired': False,
                 'search_meta': {'search_score': 0.9, 'match_type': 'very_high', 'search_normalized_score': 90.0}}]
            answer.append({'row': row, 'results': results, 'map_config': [], 'filter': {}})
        if not self.wire_format:
            return {'results': answer, 'source': '/orgs/HPO/sources/HPO/', 'source_version': 'v1',
                    'algorithm': 'fake'}
        return answer

    def task_body(self, task):
        body = {'id': task.id, 'state': task.state, 'endpoint': task.endpoint, 'lane': task.lane,
                'url': f'/tasks/{task.id}/', 'created_at': '2026-01-01T00:00:00Z', 'started_at': None,
                'finished_at': None}
        if task.state == 'queued':
            body['position'] = 1
        if task.state == 'running' and self.rows_done is not None:
            body['progress'] = {'rows_done': self.rows_done, 'rows_total': len(task.body.get('rows') or [])}
        if task.state == 'succeeded':
            body['result'] = self._result(task)
        if task.state in ('failed', 'cancelled', 'expired'):
            body['error'] = task.error or f'The call was {task.state}.'
        return body

    def _create(self, token, key, endpoint, body, semantic):
        rows = len(body.get('rows') or [])
        lane = 'interactive' if endpoint == '$match' and rows == 1 and semantic else (
            'es2_knn' if semantic else 'api_heavy')
        now = time.monotonic()
        final = self.final_states.popleft() if self.final_states else 'succeeded'
        finish_at = None if self.hold_tasks else now + self.task_seconds
        task = FakeTask(id=uuid.uuid4().hex, token=token, key=key, endpoint=endpoint, lane=lane,
                        semantic=semantic, body=body, created=now, finish_at=finish_at, final_state=final)
        self.tasks[task.id] = task
        if key:
            self.keys[(token, key)] = task.id
        self.max_open = max(self.max_open, len(self.open_tasks()))
        self.max_open_lane[lane] = max(self.max_open_lane[lane], len(self.open_tasks(lane=lane)))
        return task

    def capacity_headers(self, token, decision='admitted'):
        suggested = self.suggested(self, token) if callable(self.suggested) else self.suggested
        if suggested is None:
            return {}
        open_count = len(self.open_tasks())
        if self.standard_only:  # the user's lane as a concurrency quota of `suggested` calls
            mine = len(self.open_tasks(token=token))
            return {'RateLimit-Policy': f'"user";q={suggested};qu="concurrent-requests", "rate";q=600;w=60',
                    'RateLimit': f'"user";r={max(suggested - mine, 0)}, "rate";r=590;t=60'}
        return {'X-OCL-Capacity-Decision': decision, 'X-OCL-Capacity-Limit': '4',
                'X-OCL-Capacity-In-Flight': str(open_count),
                'X-OCL-Capacity-Tier': TIERS.get(token, 'preview'),
                'X-OCL-Capacity-Suggested-Concurrency': str(suggested)}

    def status(self):
        self._advance()
        open_ = self.open_tasks()
        tiers = Counter(TIERS.get(task.token, 'preview') for task in open_)
        users = Counter(task.token for task in open_)
        return {
            'mode': 'enforce', 'redis': 'ok',
            'api_heavy': {'in_flight': len(open_), 'limit': 4, 'bulk_limit': 3},
            'es2_knn': {'in_flight': sum(1 for task in open_ if task.semantic), 'limit': 3, 'bulk_limit': 2},
            'tasks': {},
            'tiers': {tier: {'in_flight': tiers.get(tier, 0), 'limit': 4}
                      for tier in ('staff', 'core', 'preview')},
            'users': {token: {'in_flight': count} for token, count in users.items()},
            'queues': {lane: {'depth': 0, 'pool': 1} for lane in ('interactive', 'es2_knn', 'api_heavy')},
        }

    # --- HTTP ------------------------------------------------------------------------------------------

    def _handler_class(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                # Headers and body go out in two writes: without this, Nagle + delayed ACK add 40 ms each.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except (ConnectionError, OSError):
                    self.close_connection = True

            def _send(self, status, body=None, headers=None):
                data = b'' if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, str(value))
                self.end_headers()
                self.wfile.write(data)

            def _seen(self):
                length = int(self.headers.get('Content-Length') or 0)
                raw = self.rfile.read(length) if length else b''
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                parts = urlsplit(self.path)
                seen = Seen(method=self.command, path=parts.path,
                            query={k: v[0] for k, v in parse_qs(parts.query).items()},
                            headers={k.lower(): v for k, v in self.headers.items()}, body=body,
                            at=time.monotonic())
                token = (self.headers.get('Authorization') or '').removeprefix('Token ').strip()
                return seen, token

            def _dispatch(self):
                seen, token = self._seen()
                with api.cond:
                    api.seen.append(seen)
                if token not in TIERS:
                    return self._send(401, {'detail': 'Invalid token.',
                                            'error_code': 'authentication_failed'})
                if seen.path in ('/concepts/$match/', '/concepts/$rerank/') and self.command == 'POST':
                    return self._post(seen, token)
                if seen.path.startswith('/tasks/'):
                    return self._task(seen, token)
                if seen.path == '/capacity/status/' and self.command == 'GET':
                    if TIERS[token] != 'staff':
                        return self._send(403, {'detail': 'Staff only.', 'error_code': 'permission_denied'})
                    with api.cond:
                        return self._send(200, api.status())
                if seen.path == '/sources/' and self.command == 'GET':
                    return self._send(200, [{'url': '/orgs/HPO/sources/HPO/', 'org': 'HPO', 'mnemonic': 'HPO',
                                             'name': 'HPO', 'version': 'v1', 'concept_count': 42}])
                return self._send(404, {'detail': 'Not found.', 'error_code': 'not_found'})

            do_GET = do_POST = do_DELETE = _dispatch

            def _post(self, seen, token):
                endpoint = '$match' if 'match' in seen.path else '$rerank'
                semantic = seen.query.get('semantic') == 'true'
                key = seen.headers.get('idempotency-key')
                with api.cond:
                    seen.open_before = len(api.open_tasks(token=token))
                    if key and (token, key) in api.keys:  # a replay: the earlier handle, no capacity headers
                        task = api.tasks[api.keys[(token, key)]]
                        seen.answer = 202
                        return self._handle(task, {})
                    reply = api.script.popleft() if api.script else api.default
                    limit = api.per_token_limit.get(token)
                    if isinstance(reply, Accept) and limit is not None and seen.open_before >= limit:
                        reply = Refuse(retry_after=api.refuse_retry_after, scope='user')
                    if isinstance(reply, (Accept, EndedFailed)) or (isinstance(reply, Drop) and reply.admit):
                        task = api._create(token, key, endpoint, seen.body, semantic)
                        if isinstance(reply, EndedFailed):
                            task.state, task.error = 'failed', reply.error
                        headers = api.capacity_headers(token)
                        api.cond.notify_all()
                if isinstance(reply, Accept):
                    seen.answer = 202
                    return self._handle(task, headers)
                if isinstance(reply, Drop):
                    self.close_connection = True
                    return None
                if isinstance(reply, Trickle):
                    return self._trickle(reply)
                if isinstance(reply, Refuse):
                    seen.answer = 429
                    headers = {'Retry-After': reply.retry_after, 'X-OCL-Capacity-Decision': 'refused'}
                    if reply.suggested is not None:
                        headers['X-OCL-Capacity-Suggested-Concurrency'] = reply.suggested
                    if api.standard_only:
                        headers = {'Retry-After': reply.retry_after,
                                   'RateLimit-Policy': f'"{reply.scope}";q=1;qu="concurrent-requests"',
                                   'RateLimit': f'"{reply.scope}";r=0;t={reply.retry_after}'}
                    detail = f'Matching is busy. Please retry in {reply.retry_after} seconds.'
                    return self._send(429, {'detail': detail, 'error_code': 'capacity_exceeded',
                                            'scope': reply.scope, 'paused': reply.paused,
                                            'retry_after': reply.retry_after}, headers)
                if isinstance(reply, RateLimit):
                    seen.answer = 429
                    return self._send(429, {'detail': 'Request was throttled.', 'error_code': 'rate_limited',
                                            'retry_after': reply.retry_after},
                                      {'Retry-After': reply.retry_after})
                if isinstance(reply, Error):
                    seen.answer = reply.status
                    return self._send(reply.status, {'detail': 'The work queue is unavailable.',
                                                     'error_code': reply.code})
                if isinstance(reply, EndedFailed):
                    seen.answer = 400
                    return self._send(400, {'detail': reply.error, 'error_code': 'invalid'},
                                      {'Content-Location': f'/tasks/{task.id}/'})
                if isinstance(reply, Invalid):
                    seen.answer = 400
                    return self._send(400, {'detail': reply.fields, 'error_code': 'invalid'})
                raise AssertionError(f'unknown scripted reply {reply!r}')

            def _handle(self, task, headers):
                body = {'id': task.id, 'state': 'queued', 'endpoint': task.endpoint, 'lane': task.lane,
                        'url': f'/tasks/{task.id}/', 'created_at': '2026-01-01T00:00:00Z'}
                return self._send(202, body, {'Location': f'/tasks/{task.id}/', **headers})

            def _trickle(self, reply):
                self.wfile.write(b'HTTP/1.1 202 Accepted\r\nX-Slow: ')
                self.wfile.flush()
                while not api.closing.wait(reply.every):
                    self.wfile.write(b'a')
                    self.wfile.flush()
                self.close_connection = True

            def _task(self, seen, token):
                task_id = seen.path.strip('/').split('/')[-1]
                with api.cond:
                    task = api.tasks.get(task_id)
                    if task is None or task.token != token:
                        return self._send(404, {'detail': 'No such task.', 'error_code': 'not_found'})
                    if self.command == 'DELETE':
                        api._advance()
                        if task.state in FINAL:
                            return self._send(409, {'detail': f'The task already ended ({task.state}).',
                                                    'error_code': 'conflict'})
                        task.state = 'cancelled'
                        api.cond.notify_all()
                        return self._send(200, api.task_body(task))
                    wait = min(float(seen.query.get('wait', 0) or 0), api.long_poll_cap)
                    deadline = time.monotonic() + wait
                    api._advance()
                    while task.state not in FINAL and not api.closing.is_set():
                        now = time.monotonic()
                        if now >= deadline:
                            break
                        until = deadline if task.finish_at is None else min(deadline, task.finish_at)
                        api.cond.wait(max(0.001, until - now))
                        api._advance()
                    body = api.task_body(task)
                headers = {} if task.state in FINAL else {'Retry-After': api.poll_hint}
                return self._send(200, body, headers)

        return Handler
