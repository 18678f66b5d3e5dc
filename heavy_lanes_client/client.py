"""One HTTP conversation with the Heavy Lanes API: submit a heavy call, poll its task, cancel it.

    with Client('http://127.0.0.1:8000', token='...') as client:
        handle = client.submit_match(['chest pain'], source='/orgs/HPO/sources/HPO/', semantic=True)
        task = client.wait(handle)          # polls with ?wait= (long-poll) and the Retry-After hints
        client.cancel(handle)               # DELETE /tasks/<id>/
        client.tasks(run='r-1', state='failed'), client.cancel_run('r-1'), client.retry(task)  # by run

Every method sends one request (wait() a series of polls) and raises from heavy_lanes_client.errors when
the answer is not a success (answers.error_for picks which); retrying is the caller's choice
(heavy_lanes_client.run does it). Every heavy call carries an Idempotency-Key (a new one unless given:
pass the same key to retry the same call) and `X-OCL-Event-Metadata: {"capacity_aware": "true"}`, so an
enforcing server answers 429 instead of making the call wait, and always answers 202 with a handle
instead of holding the request.
"""
import json
import random
import time
import uuid
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter

from heavy_lanes_client import __version__, errors
from heavy_lanes_client.answers import error_for, json_or_none
from heavy_lanes_client.models import (
    MATCH,
    RERANK,
    Capacity,
    Handle,
    Source,
    State,
    Task,
    retry_after_seconds,
)
from heavy_lanes_client.retry import RetryPolicy
from heavy_lanes_client.rows import as_rows

USER_AGENT = f'heavy-lanes-client/{__version__}'
REQUEST_SOURCE = 'heavy-lanes-client'
CONNECT_TIMEOUT = 5.0   # seconds
READ_TIMEOUT = 30.0     # seconds; a long poll adds its wait on top
DEFAULT_LONG_POLL = 20  # seconds per GET /tasks/<id>/?wait=N (the server caps it)
POLL_BACKOFF = RetryPolicy()  # its backoff after a failed poll: 0.5 s doubling, at most 30 s, with jitter


class Client:
    """The Heavy Lanes API for one token. Thread-safe for concurrent calls (one pooled session).

    `timeout` is (connect, read) in seconds. `capacity_aware=False` leaves out the capacity_aware flag
    (an enforcing server with enforce_for=aware then never refuses this client).
    """

    def __init__(self, base_url, token, *, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT), capacity_aware=True,
                 pool_size=16, session=None, rng=None):
        parts = urlsplit(base_url)
        if parts.scheme not in ('http', 'https') or not parts.hostname:
            raise ValueError(f'base_url must be an http(s) URL, got {base_url!r}')
        self.base_url = base_url.rstrip('/') + '/'
        self.token = token
        self.timeout = timeout
        self.capacity_aware = capacity_aware
        self.rng = rng or random.Random()
        self.session = session or requests.Session()
        self._owns_session = session is None
        if self._owns_session:
            # No transport-level retries: a POST is retried only by the caller, with the same key.
            adapter = HTTPAdapter(pool_connections=2, pool_maxsize=max(pool_size, 2), max_retries=0)
            self.session.mount('http://', adapter)
            self.session.mount('https://', adapter)
        self.session.headers.update({
            'Authorization': f'Token {token}',
            'Accept': 'application/json',
            'User-Agent': USER_AGENT,
            'X-OCL-Request-Source': REQUEST_SOURCE,
        })

    def close(self):
        if self._owns_session:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- plumbing ------------------------------------------------------------------------------------

    def url(self, path):
        if path.startswith(('http://', 'https://')):
            return path
        return urljoin(self.base_url, path.lstrip('/'))

    def request(self, method, path, *, read_timeout=None, **kwargs):
        """One HTTP request; a missing answer is a TransportError. Returns the response, any status."""
        connect, read = self.timeout
        try:
            return self.session.request(method, self.url(path), timeout=(connect, read_timeout or read),
                                        **kwargs)
        except requests.RequestException as ex:
            raise errors.TransportError(f'no answer ({type(ex).__name__}: {ex})'[:300], cause=ex) from ex

    def metadata_header(self, metadata=None):
        values = {'capacity_aware': 'true'} if self.capacity_aware else {}
        values.update(metadata or {})
        return json.dumps(values, separators=(',', ':'))

    # --- heavy calls ---------------------------------------------------------------------------------

    def submit(self, endpoint, body, *, params=None, idempotency_key=None, metadata=None, wait=0):
        """POST one heavy call; a Handle on 202 (or 200), a ClientError otherwise. One attempt.

        With `wait` > 0 (`Prefer: respond-async, wait=N`) the server may hold the answer up to that many
        seconds: a call that ended by then comes back finished (`Handle.immediate`, also when it failed),
        saving the polls a quick call would otherwise take."""
        key = idempotency_key or uuid.uuid4().hex
        wait = int(wait or 0)
        headers = {'Idempotency-Key': key, 'Prefer': f'respond-async, wait={wait}' if wait > 0 else 'respond-async',
                   'X-OCL-Event-Metadata': self.metadata_header(metadata)}
        path = 'concepts/$match/' if endpoint == MATCH else 'concepts/$rerank/'
        response = self.request('POST', path, params=params or None, json=body, headers=headers,
                                read_timeout=self.timeout[1] + wait if wait > 0 else None)
        location = response.headers.get('Content-Location')
        if response.status_code not in (200, 202) and wait > 0 and location:
            # The call ended within the wait, not in success: the in-request endpoint's error, and its task.
            task = self.get_task(location.rstrip('/').rsplit('/', 1)[-1])
            return Handle(id=task.id, url=location, endpoint=endpoint, lane=task.lane, state=task.state,
                          idempotency_key=key, capacity=Capacity.from_headers(response.headers),
                          created_at=task.created_at, immediate=task)
        if response.status_code not in (200, 202):
            raise error_for(response)
        return self._handle(endpoint, response, key)

    def submit_match(self, rows, source, *, semantic=True, reranker=False, limit=5, idempotency_key=None,
                     metadata=None, wait=0):
        """POST /concepts/$match/ for `rows` (strings or {"name": ...} dicts) against `source`.

        Lexical without reranker is not a heavy call: the server answers 200 with the result, returned as
        a Handle whose `immediate` task holds it.
        """
        params = {'limit': str(limit)}  # OCL reads limit from the query string
        if semantic:
            params['semantic'] = 'true'
        if reranker:
            params['reranker'] = 'true'
        body = {'rows': as_rows(rows), 'target_repo_url': source}
        return self.submit(MATCH, body, params=params, idempotency_key=idempotency_key, metadata=metadata,
                           wait=wait)

    def submit_rerank(self, q, rows, *, idempotency_key=None, metadata=None, wait=0):
        """POST /concepts/$rerank/: score candidate `rows` (strings or dicts with "name") against `q`."""
        body = {'q': q, 'rows': as_rows(rows), 'name_key': 'name'}  # OCL's default name_key is display_name
        return self.submit(RERANK, body, idempotency_key=idempotency_key, metadata=metadata, wait=wait)

    def _handle(self, endpoint, response, key):
        body = json_or_none(response)
        capacity = Capacity.from_headers(response.headers)
        if response.status_code == 200 and isinstance(body, list):
            # Answered in the request (a lexical $match, or a call that ended within the wait): the body is
            # the endpoint's answer, and Content-Location names the task when there is one.
            location = response.headers.get('Content-Location')
            task_id = location.rstrip('/').rsplit('/', 1)[-1] if location else None
            task = Task(id=task_id, state=State.SUCCEEDED, endpoint=endpoint, result=body)
            return Handle(id=task_id, url=location, endpoint=endpoint, lane=None, state=task.state,
                          idempotency_key=key, capacity=capacity, created_at=None, immediate=task)
        if not isinstance(body, dict):
            raise errors.ProtocolError(f'HTTP {response.status_code} without a JSON object body',
                                       status=response.status_code, capacity=capacity)
        try:
            if response.status_code == 200:
                if 'state' in body and 'id' in body:  # an earlier server's waited task envelope
                    task = Task.from_body(body)
                else:  # an earlier server's lexical answer (an object)
                    task = Task(id=None, state=State.SUCCEEDED, endpoint=endpoint, result=body)
                return Handle(id=task.id, url=None, endpoint=endpoint, lane=task.lane, state=task.state,
                              idempotency_key=key, capacity=capacity, created_at=task.created_at,
                              immediate=task)
            url = body.get('url') or response.headers.get('Location') or f'/tasks/{body["id"]}/'
            return Handle(id=body['id'], url=url, endpoint=body.get('endpoint') or endpoint,
                          lane=body.get('lane'), state=State(body.get('state', 'queued')),
                          idempotency_key=key, capacity=capacity, created_at=body.get('created_at'))
        except (KeyError, ValueError, TypeError) as ex:
            raise errors.ProtocolError(f'unreadable handle ({type(ex).__name__}: {ex})',
                                       status=response.status_code, capacity=capacity) from ex

    # --- tasks ---------------------------------------------------------------------------------------

    @staticmethod
    def _task_path(task):
        if isinstance(task, str):
            return f'tasks/{task}/'
        if getattr(task, 'url', None):
            return task.url
        if getattr(task, 'id', None):
            return f'tasks/{task.id}/'
        raise ValueError('this handle has no task to poll or cancel (the call was answered in the request)')

    def _task(self, response):
        body = json_or_none(response)
        try:
            return Task.from_body(body, poll_after=retry_after_seconds(response.headers.get('Retry-After')))
        except (KeyError, ValueError, TypeError, AttributeError) as ex:
            raise errors.ProtocolError(f'unreadable task ({type(ex).__name__}: {ex})',
                                       status=response.status_code) from ex

    def get_task(self, task, wait=0):
        """GET /tasks/<id>/ once; with `wait` > 0 the server holds the answer up to that many seconds."""
        if isinstance(task, Handle) and task.immediate is not None:
            return task.immediate
        params = {'wait': int(wait)} if wait and wait > 0 else None
        response = self.request('GET', self._task_path(task), params=params,
                                read_timeout=self.timeout[1] + (wait or 0))
        if response.status_code != 200:
            raise error_for(response, not_found=errors.TaskNotFound)
        return self._task(response)

    def wait(self, handle, *, timeout=None, long_poll=DEFAULT_LONG_POLL, sleep=None, max_errors=8,
             clock=time.monotonic, on_task=None):
        """Poll until the task finishes; return the last Task seen. `on_task(task)` is called with every
        Task a poll answered (its `rows_done` shows how far a running one has got).

        Each poll long-polls up to `long_poll` s; an unfinished answer is followed by a pause of the
        server's Retry-After hint less the time the poll already took. Returns early, with the task
        unfinished, after `timeout` s or when `sleep(seconds)` returns true (the caller wants to stop).
        Transient errors (no answer, 5xx) are retried with backoff, up to `max_errors` in a row (GaveUp).
        """
        if isinstance(handle, Handle) and handle.immediate is not None:
            return handle.immediate
        sleep = sleep or (lambda seconds: time.sleep(seconds))
        deadline = None if timeout is None else clock() + timeout
        failures = 0
        last = None
        while True:
            remaining = None if deadline is None else deadline - clock()
            if remaining is not None and remaining <= 0 and last is not None:
                return last
            poll = long_poll if remaining is None else max(0, min(long_poll, int(remaining)))
            started = clock()
            try:
                task = self.get_task(handle, wait=poll)
            except errors.ClientError as ex:
                if not ex.retryable:
                    raise
                failures += 1
                if failures >= max_errors:
                    raise errors.GaveUp(f'lost contact with task after {failures} failed polls: {ex.reason}',
                                        last=ex, attempts=failures) from ex
                pause = POLL_BACKOFF.backoff(failures, self.rng)
                if ex.retry_after is not None:
                    pause = max(pause, min(ex.retry_after, POLL_BACKOFF.backoff_max_seconds))
                if sleep(pause):
                    return last if last is not None else Task(id=getattr(handle, 'id', handle),
                                                              state=State.QUEUED)
                continue
            failures = 0
            last = task
            if on_task is not None:
                on_task(task)
            if task.finished:
                return task
            hint = task.poll_after if task.poll_after is not None else 1.0
            pause = max(0.0, hint - (clock() - started))
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - clock()))
            if sleep(pause):
                return task

    def cancel(self, task):
        """DELETE /tasks/<id>/; returns the task as it ended (already-finished tasks: their final state)."""
        response = self.request('DELETE', self._task_path(task))
        if response.status_code == 409:  # it ended before we asked: report how
            return self.get_task(task)
        if response.status_code != 200:
            raise error_for(response, not_found=errors.TaskNotFound)
        return self._task(response)

    # --- runs --------------------------------------------------------------------------------------------

    def tasks(self, *, state=None, endpoint=None, run=None, page_size=100):
        """GET /tasks/, page after page: this token's tasks newest first, as Tasks without their results
        (get_task reads one whole). `state` is one state or several; `run` an `automatch_run_id`."""
        states = ','.join(str(value) for value in state) if isinstance(state, (list, tuple, set)) else state
        params = {name: value for name, value in (('state', states), ('endpoint', endpoint), ('run', run),
                                                  ('page_size', page_size)) if value}
        path = 'tasks/'
        while path:
            response = self.request('GET', path, params=params)
            if response.status_code != 200:
                raise error_for(response)
            body = json_or_none(response)
            if not isinstance(body, dict) or not isinstance(body.get('results'), list):
                raise errors.ProtocolError('GET /tasks/ did not answer a page', status=response.status_code)
            for item in body['results']:
                yield Task.from_body(item)
            path, params = body.get('next'), None  # `next` carries the filters

    def cancel_run(self, run):
        """DELETE /tasks/?run=<run>: cancel every open task of this token's run; returns how many."""
        response = self.request('DELETE', 'tasks/', params={'run': run})
        body = json_or_none(response)
        if response.status_code != 200:
            raise error_for(response)
        if not isinstance(body, dict) or not isinstance(body.get('cancelled'), int):
            raise errors.ProtocolError('DELETE /tasks/ did not say how many it cancelled',
                                       status=response.status_code)
        return body['cancelled']

    def retry(self, task, *, idempotency_key=None, wait=0):
        """POST /tasks/<id>/retry/: a failed, expired or cancelled task sent again as a new call (in its
        run); the new call's Handle, as submit() gives it. RequestRejected (409, error_code `conflict`) for a
        task that is queued, running or succeeded; TaskNotFound for one that isn't this token's."""
        key = idempotency_key or uuid.uuid4().hex
        wait = int(wait or 0)
        headers = {'Idempotency-Key': key, 'Prefer': f'respond-async, wait={wait}' if wait > 0 else 'respond-async',
                   'X-OCL-Event-Metadata': self.metadata_header()}
        response = self.request('POST', self._task_path(task) + 'retry/', headers=headers,
                                read_timeout=self.timeout[1] + wait if wait > 0 else None)
        if response.status_code not in (200, 202):
            raise error_for(response, not_found=errors.TaskNotFound)
        return self._handle(getattr(task, 'endpoint', None), response, key)

    # --- reference data --------------------------------------------------------------------------------

    def sources(self):
        """GET /sources/: the loaded concept sources."""
        response = self.request('GET', 'sources/')
        if response.status_code != 200:
            raise error_for(response)
        body = json_or_none(response)
        items = body.get('results', []) if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise errors.ProtocolError('GET /sources/ did not answer a list', status=response.status_code)
        return [Source(url=item['url'], name=item.get('name') or item['url'], version=item.get('version'),
                       concept_count=item.get('concept_count'), org=item.get('org'),
                       mnemonic=item.get('mnemonic'))
                for item in items if isinstance(item, dict) and item.get('url')]

    def capacity_status(self):
        """GET /capacity/status/ (staff only): lanes' in-flight and limits, queues, Redis health."""
        response = self.request('GET', 'capacity/status/')
        if response.status_code != 200:
            raise error_for(response)
        body = json_or_none(response)
        if not isinstance(body, dict):
            raise errors.ProtocolError('GET /capacity/status/ did not answer an object',
                                       status=response.status_code)
        return body
