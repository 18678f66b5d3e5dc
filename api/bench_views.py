"""Benchmark floors: bare views on the real API server that the heavy calls are measured against.

Mounted under /bench/ only when settings.HEAVY_LANES_BENCH_VIEWS is on (never in production); the bench
stack (bench/stack.py) turns it on and starts the lane workers with `--include api.bench_views`, so they
register `bench_match` too.

- `POST /bench/submit/` — the submission floor (bench/submission.py): DRF token authentication, the JSON
  body parsed, a 202 with a handle-shaped body and a Location header. No validation, gate, rate limit,
  row, metering or enqueue.
- `POST /bench/delay/?semantic=true` — the submission floor a Celery user writes by hand
  (bench/submission.py): the body validated by the heavy view's own `validate_match`, then
  `bench_match.apply_async(...)` on the lane queue the heavy call would use (what `.delay()` does, with the
  queue named), the same broker and app; a 202 with the task id. No gate, rate limit, row, shared work or
  capacity headers.
- `POST /bench/durable/?semantic=true` — the submission floor with the heavy call's guarantee
  (bench/submission.py): the body validated as `/bench/delay/` does, then, in one transaction, a durable row
  (django-celery-results' `TaskResult`, PENDING, with the payload) and `bench_match.delay`-style publish on
  commit (`transaction.on_commit` + `apply_async` on the lane queue, task id = the row's): the row exists
  before the 202, and a message is sent only for a row that committed. No gate, rate limit or shared work.
- `POST /bench/inrequest/$match/?semantic=true` — the in-request world (bench/flood.py): OCL's `$match` as
  the seed ran it, the domain work inside the request, on whatever server runs it (the flood runs gunicorn
  sync workers, as OCL's API containers do); 200 with OCL's answer, `X-Run-Ms` the work's own time.
- `POST /bench/roundtrip/?semantic=true[&interval=0.005]` — the round-trip floor (bench/roundtrip.py): the
  same body as `$match`, validated by the same function, then `bench_match.apply_async(...).get()` on the
  lane queue the heavy call would use, the same broker, workers and result backend (django-db). `interval`
  is the seconds between `.get()`'s polls of the result backend (Celery's default: 0.5). Answers 200 with
  the result.

`bench_match` does the heavy call's domain work (concepts.services.run_match, which validates again as
the heavy call's worker does) without the heavy call's plumbing: no lease renewal or release, no call row,
no completion notice.

Experiment, off unless HEAVY_LANES_BENCH_PROJECTION_FIX=1 (bench/work.py and bench/roundtrip.py
--projection-fix): any process that imports this module then runs TfidfSvdEmbedder.embed as the fix
proposed in docs/benchmarks.md would (the SVD projection made C-contiguous once, instead of
TruncatedSVD.transform copying its 256 x 56,020 components on every call), so the benchmarks can show
what the fix is worth before it is made. Same results (to float32 rounding).

Known durations, off unless HEAVY_LANES_BENCH_CALL_SECONDS=S (bench/retry_after.py): a worker that imports
this module makes every heavy call's work last at least S seconds (the real work, then a sleep for the
rest), so a benchmark can hold a lane with calls of a known length.

Experiment, off unless HEAVY_LANES_BENCH_DB_REUSE=1 (bench/roundtrip.py --db-reuse): a worker that imports
this module keeps its database connections between tasks (closing only unusable or obsolete ones, by
CONN_MAX_AGE), as the proposed `CELERY_DB_REUSE_MAX` setting would, instead of Celery's Django fixup closing
every connection before and after every task.

Round trips counted, off unless HEAVY_LANES_BENCH_ROUND_TRIPS_DIR=DIR (bench/cost.py): any process that imports
this module (the API's processes, the lane workers and their pool processes, the benchmark itself) counts
its Redis round trips into DIR (api/bench_round_trips.py).
"""
import json
import os
import time
import uuid

from django.db import transaction
from django.urls import path
from django.utils import timezone
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.constants import MATCH
from workers.celery import app  # the workers' Celery app: the same broker, result backend and queues
from workers.lanes import route

TRUTHY = ('true', '1', 'yes', 'on')
DEFAULT_INTERVAL = 0.5  # Celery's AsyncResult.get() default
GET_TIMEOUT = 60


@app.task(name='heavy_lanes.bench.match')
def bench_match(body, semantic, reranker):
    """The `$match` domain work alone."""
    from concepts import services
    return services.run_match(body, semantic=semantic, reranker=reranker)


class BareSubmitView(APIView):
    """Authenticate, parse, answer 202: what any submission costs before Heavy Lanes does anything."""

    permission_classes = (IsAuthenticated,)

    def post(self, request):
        rows = len(request.data.get('rows') or []) if isinstance(request.data, dict) else 0
        call_id = uuid.uuid4().hex
        url = f'/tasks/{call_id}/'
        lane = route(MATCH, max(rows, 1), True).name
        return Response({'id': call_id, 'state': 'queued', 'endpoint': MATCH, 'lane': lane,
                         'url': url, 'created_at': timezone.now()},
                        status=status.HTTP_202_ACCEPTED, headers={'Location': url})


def prepared(request):
    """A `$match` request as the heavy view validates it: (payload, semantic, reranker, its queue)."""
    from concepts import services
    payload = services.validate_match(request.data, request.query_params)
    semantic = request.query_params.get('semantic', '').lower() in TRUTHY
    reranker = request.query_params.get('reranker', '').lower() in TRUTHY
    return payload, semantic, reranker, route(MATCH, len(payload['body']['rows']), semantic).name


class DelaySubmitView(APIView):
    """Validate a `$match` body, publish its domain work with apply_async, answer 202 with the task id."""

    permission_classes = (IsAuthenticated,)

    def post(self, request):
        body, semantic, reranker, queue = prepared(request)
        task = bench_match.apply_async(args=[body, semantic, reranker], queue=queue)
        url = f'/tasks/{task.id}/'
        return Response({'id': task.id, 'state': 'queued', 'url': url}, status=status.HTTP_202_ACCEPTED,
                        headers={'Location': url})


class DurableSubmitView(APIView):
    """Validate a `$match` body, write its row and publish it when the row commits, answer 202."""

    permission_classes = (IsAuthenticated,)

    def post(self, request):
        from django_celery_results.models import TaskResult
        body, semantic, reranker, queue = prepared(request)
        task_id = uuid.uuid4().hex
        args = [body, semantic, reranker]
        with transaction.atomic():
            TaskResult.objects.create(task_id=task_id, status='PENDING', task_name=bench_match.name,
                                      task_args=json.dumps(args))
            transaction.on_commit(lambda: bench_match.apply_async(args=args, task_id=task_id, queue=queue))
        url = f'/tasks/{task_id}/'
        return Response({'id': task_id, 'state': 'queued', 'url': url}, status=status.HTTP_202_ACCEPTED,
                        headers={'Location': url})


class InRequestMatchView(APIView):
    """`$match` run inside the request, as the seed ran it: validate, run, answer 200 with OCL's body."""

    permission_classes = (IsAuthenticated,)

    def post(self, request):
        from concepts import services
        body, semantic, reranker, _ = prepared(request)
        started = time.perf_counter()
        answer = services.run_match(body, semantic=semantic, reranker=reranker)
        run_ms = (time.perf_counter() - started) * 1000
        return Response(answer, headers={'X-Run-Ms': f'{run_ms:.1f}'})


class BareRoundTripView(APIView):
    """Validate a `$match` body, run its domain work on the lane's queue with apply_async().get()."""

    permission_classes = (IsAuthenticated,)

    def post(self, request):
        body, semantic, reranker, queue = prepared(request)
        interval = float(request.query_params.get('interval', DEFAULT_INTERVAL))
        result = bench_match.apply_async(args=[body, semantic, reranker], queue=queue).get(
            timeout=GET_TIMEOUT, interval=interval)
        return Response({'state': 'succeeded', 'result': result})


def simulate_projection_fix():
    """Patch TfidfSvdEmbedder.embed in this process with the proposed fix (see the module docstring)."""
    import numpy as np

    from concepts.matching import embedders
    from concepts.matching.text import normalize

    def embed(self, texts):
        projection = self.__dict__.get('_bench_projection')
        if projection is None:
            # TruncatedSVD.transform(X) is X @ components_.T; scipy copies a non-contiguous right-hand side.
            projection = self._bench_projection = np.ascontiguousarray(self.svd.components_.T)
        matrix = self.vectorizer.transform([normalize(text) for text in texts])
        return embedders.l2_normalize(matrix @ projection)

    embedders.TfidfSvdEmbedder.embed = embed


def simulate_db_reuse():
    """Patch Celery's Django worker fixup in this process to keep usable connections (see the docstring)."""
    from celery.fixups.django import DjangoWorkerFixup

    def close_database(self, **kwargs):
        for connection in self._db.connections.all(initialized_only=True):
            connection.close_if_unusable_or_obsolete()

    DjangoWorkerFixup.close_database = close_database


def hold_calls_for(seconds):
    """Make every heavy call's work in this process last at least `seconds` (see the module docstring)."""
    import time

    from workers import work
    perform = work.perform

    def perform_for_at_least(call):
        started = time.monotonic()
        result = perform(call)
        time.sleep(max(seconds - (time.monotonic() - started), 0))
        return result

    work.perform = perform_for_at_least


if os.environ.get('HEAVY_LANES_BENCH_CALL_SECONDS'):
    hold_calls_for(float(os.environ['HEAVY_LANES_BENCH_CALL_SECONDS']))
if os.environ.get('HEAVY_LANES_BENCH_PROJECTION_FIX') == '1':
    simulate_projection_fix()
if os.environ.get('HEAVY_LANES_BENCH_DB_REUSE') == '1':
    simulate_db_reuse()
if os.environ.get('HEAVY_LANES_BENCH_ROUND_TRIPS_DIR'):
    from api import bench_round_trips
    bench_round_trips.install(os.environ['HEAVY_LANES_BENCH_ROUND_TRIPS_DIR'])


urlpatterns = [
    path('submit/', BareSubmitView.as_view(), name='bench-submit'),
    path('delay/', DelaySubmitView.as_view(), name='bench-delay'),
    path('durable/', DurableSubmitView.as_view(), name='bench-durable'),
    path('inrequest/$match/', InRequestMatchView.as_view(), name='bench-inrequest-match'),
    path('roundtrip/', BareRoundTripView.as_view(), name='bench-roundtrip'),
]
