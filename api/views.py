"""The HTTP layer: heavy-call views, task handles, health. Views validate, call a service, and render.

Order inside a heavy call (HeavyCallView.submit, each step a call of workers.submission): authentication,
permissions, body validation, the Idempotency-Key, identical work (a warm result or an open work to join:
no gate), else the capacity gate, then the rate limit, then usage metering and the queue. A capacity
refusal therefore costs no rate-limit allowance and no metered usage.
"""
import json
from contextlib import nullcontext

from django.db import connection
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from api import errors, prefer
from api.params import whole_param
from api.parsers import StrictJSONParser
from api.renderers import StreamsStoredResults, list_response
from api.schema import (ERROR, HEAVY_PARAMETERS, HEAVY_RESPONSES, MATCH_ENTRY, NUM_RETURNED, POLL_HINT,
                        RERANKED_ROWS, TASK, response_header)
from api.throttles import HeavyRateThrottle
from capacity.admission import headers, quotas, refusal_body
from capacity.caller import MAX_RUN_CHARS, RequestFacts, run_id_too_long
from capacity.config import get_config
from capacity.constants import MATCH, RERANK
from common import ratelimit
from workers import idempotency, lifecycle, submission
from workers.models import Call, State, Work

TRUTHY = ('true', '1', 'yes', 'on')
MAX_POLL_SECONDS = 30
CANCEL_WAIT_SECONDS = 3  # how long DELETE of a running call waits for its work to stop


class HealthView(APIView):
    """Liveness: the process answers and its database connection works."""

    authentication_classes = ()
    permission_classes = (AllowAny,)

    @extend_schema(responses={200: inline_serializer('Health', {'status': serializers.CharField()})})
    def get(self, request):
        with connection.cursor() as cursor:
            cursor.execute('SELECT 1')
        return Response({'status': 'ok'})


class ReadyView(APIView):
    """Readiness: this host's own fitness, its database taking writes, the lane store and the broker
    (api.readiness). 200 when all answer, else 503; every check is in the body, and beside them what is
    wrong in the cluster (a lane without a consumer), which never fails a host's readiness."""

    authentication_classes = ()
    permission_classes = (AllowAny,)

    @extend_schema(parameters=[response_header('Retry-After', [503], 'Seconds: when to ask again.',
                                               OpenApiTypes.INT)], responses={
        200: inline_serializer('Ready', {'status': serializers.CharField(), 'checks': serializers.DictField(),
                                         'cluster': serializers.DictField()}),
        503: inline_serializer('NotReady', {'status': serializers.CharField(), 'checks': serializers.DictField(),
                                            'cluster': serializers.DictField()})})
    def get(self, request):
        from api.readiness import run_checks
        ready, checks, cluster = run_checks()
        if ready:
            return Response({'status': 'ready', 'checks': checks, 'cluster': cluster})
        return Response({'status': 'not ready', 'checks': checks, 'cluster': cluster},
                        status=status.HTTP_503_SERVICE_UNAVAILABLE,
                        headers={'Retry-After': str(errors.SERVICE_RETRY_SECONDS)})


def task_url(call_id):
    return f'/tasks/{call_id}/'


def handle_body(call, progress_now=None):
    """The 202 body: a handle to poll, with when the call should start and finish. `lane` is the call's
    queue (the name clients already read)."""
    progress_now = progress_now or lifecycle.progress(call)
    return {'id': call.pk, 'state': lifecycle.seen(call, call.work).state, 'endpoint': call.endpoint,
            'lane': call.work.queue, 'url': task_url(call.pk), 'created_at': call.created_at,
            'estimated_start_at': progress_now.start_at, 'estimated_finish_at': progress_now.finish_at}


def task_body(call, progress_now=None, with_result=True):
    """GET /tasks/<id>/: state, timings, position while queued, progress (rows done) while running, when it
    should start and finish while unfinished (null when unknown, or once it did), result or error once
    finished (`with_result`: False for GET /tasks/, whose entries leave it out: it is read at their url).
    A call that shares its work with others (workers.sharing) shows that work's progress and result, as its
    own (workers.lifecycle.seen); one its owner cancelled shows `cancelled` from then on."""
    seen = lifecycle.seen(call, call.work)
    progress_now = progress_now or lifecycle.progress(call)
    body = {'id': call.pk, 'state': seen.state, 'endpoint': call.endpoint, 'lane': call.work.queue,
            'url': task_url(call.pk), 'created_at': call.created_at, 'started_at': seen.started_at,
            'finished_at': seen.finished_at,
            'estimated_start_at': progress_now.start_at, 'estimated_finish_at': progress_now.finish_at}
    if seen.state == State.QUEUED:
        body['position'] = progress_now.position
    if seen.state == State.RUNNING:  # how far its run has got (workers.progress writes it in batches)
        body['progress'] = {'rows_done': min(call.work.rows_done, call.work.rows), 'rows_total': call.work.rows}
    if seen.state == State.SUCCEEDED and with_result:
        body['result'] = lifecycle.result_json(call)  # written verbatim (api.renderers)
    if seen.error is not None:
        body['error'] = seen.error
    return body


def task_response(call, status_code=status.HTTP_200_OK, headers=None):
    progress_now = lifecycle.progress(call)
    response = Response(task_body(call, progress_now), status=status_code, headers=headers)
    if progress_now.poll_after is not None:
        response['Retry-After'] = str(progress_now.poll_after)
    return response


def with_count(response, work=None):
    """OCL's `num_returned` header on a `$match` answer: the candidates in it, all rows together (a stored
    answer's count was stored with it: it isn't parsed to be counted)."""
    if isinstance(response.data, lifecycle.StoredJSON):
        # Its completion notice brings it (workers.notify), else one small read, not a parse.
        count = work.answer_count
        if count is None:
            count = Work.objects.filter(pk=work.pk).values_list('answer_count', flat=True).first()
        if count is not None:
            response['num_returned'] = str(count)
            return response
        response.data = json.loads(response.data.whole())  # a row stored before the count was
    if isinstance(response.data, list):
        response['num_returned'] = str(sum(len(entry.get('results') or []) for entry in response.data
                                           if isinstance(entry, dict)))
    return response


def accepted(call, just_published=False):
    """202 with the handle, and Retry-After: when to poll it first (the call's expected finish).
    `just_published`: this request published the call's work a moment ago (lifecycle.progress)."""
    progress_now = lifecycle.progress(call, just_published)
    headers = {'Location': task_url(call.pk)}
    if progress_now.poll_after is not None:
        headers['Retry-After'] = str(progress_now.poll_after)
    return Response(handle_body(call, progress_now), status=status.HTTP_202_ACCEPTED, headers=headers)


def idempotency_key(request):
    """The Idempotency-Key header as the client wrote it: WSGI hands header bytes over as latin-1, and a
    key is UTF-8 text of at most 255 characters."""
    key = request.headers.get('Idempotency-Key') or None
    if key is None:
        return None
    try:
        key = key.encode('latin-1').decode('utf-8')
    except UnicodeError:
        raise errors.exceptions.ValidationError({'Idempotency-Key': ['Must be UTF-8 text.']}) from None
    if len(key) > 255:
        raise errors.exceptions.ValidationError({'Idempotency-Key': ['At most 255 characters.']})
    return key


class HeavyCallView(StreamsStoredResults, APIView):
    """A heavy call: validated, gated, throttled, metered, queued; answered 202, 200 (waited) or 429."""

    permission_classes = (IsAuthenticated,)
    # JSON only: a form or multipart body was parsed too (DRF's defaults) and offered in the schema, though
    # no call can be written as one (rows are objects).
    parser_classes = (StrictJSONParser,)
    throttle_scope = 'heavy'
    endpoint = None

    def get_throttles(self):
        # DRF checks these in initial(), before the view; heavy calls check them after the gate instead.
        return []

    def check_rate_limits(self):
        throttle = HeavyRateThrottle()
        allowed = throttle.allow_request(self.request, self)
        self.rate_quota = throttle.quota()
        if not allowed:
            self.throttled(self.request, throttle.wait())

    def flags(self, request):
        return False, False

    def key_of(self, request):
        """The Idempotency-Key this call is recorded under: the request's."""
        return idempotency_key(request)

    def submit(self, request, body, semantic, reranker, facts=None):
        """Serve one heavy call, step by step in the order the limits apply (workers.submission). `facts`:
        what the request's headers say (RequestFacts), when the view read them already."""
        config = get_config()
        if run_id_too_long(request.META):  # kept whole, or refused: a run id cut short finds other runs
            raise errors.exceptions.ValidationError({'automatch_run_id': [
                f'At most {MAX_RUN_CHARS} characters (X-OCL-Event-Metadata).']})
        facts = facts or RequestFacts.from_meta(request.META)
        preferences = prefer.parse(request.headers.get('Prefer'))
        wait = preferences.seconds(config.wait.default_seconds, config.wait.max_seconds)
        heavy = submission.prepare(request.user, self.endpoint, body, semantic=semantic, reranker=reranker,
                                   idempotency_key=self.key_of(request), waits=wait > 0, facts=facts)
        # Watched before its work is published: the end's notice can't come before the watch (workers.notify).
        with lifecycle.watching(heavy.call_id) if wait > 0 else nullcontext() as watch:
            try:
                with idempotency.claimed(heavy) as claim:  # this Idempotency-Key's call: before, or racing us
                    call = claim.earlier
                    if call is None:
                        call = self.serve(heavy)
                        claim.made(call)
            except idempotency.IdempotencyConflict as ex:
                raise errors.Unprocessable(str(ex)) from ex
            if call is None:
                return Response(refusal_body(self.admission), status=status.HTTP_429_TOO_MANY_REQUESTS)
            own = call.pk == heavy.call_id  # else this Idempotency-Key's earlier call (no capacity headers)
            self.admission = lifecycle.admission_of(call) if own else None
            published = call.work_id == heavy.call_id  # this request published the call's work
            return self.answer(call, wait, preferences, facts, watch if published else None, published)

    def serve(self, heavy):
        """The call of `heavy`: shared work, else the gate, the rate limit and the queue, in that order;
        None when the gate refused it (its admission is `self.admission`)."""
        rate_limited = False
        found = submission.shared(heavy)
        if found is not None:
            self.check_rate_limits()
            rate_limited = True
            call = submission.attach(heavy, found)
            if call is not None:
                return call  # it joined an open work, or a warm result answered it
        admission = submission.admit(heavy)
        if admission.refused:
            self.admission = admission
            return None
        if not rate_limited:
            with submission.holding(admission):  # a rate-limit refusal gives the leases back
                self.check_rate_limits()
        try:
            return submission.enqueue(heavy, admission)
        except submission.BrokerUnavailable as ex:
            raise errors.ServiceUnavailable(str(ex)) from ex

    def answer(self, call, wait, preferences, facts, watch=None, published=False):
        """What the in-request endpoint would have answered, once the call ended within `wait` seconds; a
        handle (202) for a client that asked for one at once (`respond-async` without `wait=N`), when the
        wait ran out, or when this host can't hold another waiting request. `watch`: this request's watch
        on the call's work, registered before it was published; `published`: this request published it."""
        waited, result_text = 0, None
        if wait and not lifecycle.seen(call, call.work).finished:
            with submission.waiting_slot(self.request.user, wait, facts, call.endpoint, call.rows) as allowed:
                if allowed:
                    result_text = lifecycle.wait(call, wait, watch=watch, for_answer=True).result_text
                    waited = wait
        if lifecycle.seen(call, call.work).finished and (wait or not preferences.respond_async):
            code, body = lifecycle.answer(call, result_text)
            response = with_count(Response(body, status=code, headers={'Content-Location': task_url(call.pk)}),
                                  call.work)
            applied = preferences.applied(waited or wait)
            if applied:
                response['Preference-Applied'] = applied
            if code == status.HTTP_503_SERVICE_UNAVAILABLE:
                response['Retry-After'] = str(errors.SERVICE_RETRY_SECONDS)
            return response
        response = accepted(call, just_published=published and not waited)
        applied = preferences.applied(0)
        if applied:
            response['Preference-Applied'] = applied
        return response

    def finalize_response(self, request, response, *args, **kwargs):
        """Add the capacity headers and the RateLimit fields of the lanes and the rate limit this request
        was checked against (the 429s too)."""
        response = super().finalize_response(request, response, *args, **kwargs)
        admission = getattr(self, 'admission', None)
        limits = ratelimit.fields([*quotas(admission), getattr(self, 'rate_quota', None)])
        for name, value in {**headers(admission), **limits}.items():
            response[name] = value
        return response


class MatchView(HeavyCallView):
    """POST /concepts/$match/: lexical runs in the request (200); semantic or reranked is a heavy call."""

    endpoint = MATCH

    @extend_schema(
        operation_id='concepts_match',
        request=inline_serializer('MatchRequest', {
            'rows': serializers.ListField(child=serializers.DictField()),
            'target_repo_url': serializers.CharField(required=False),
            'target_repo': serializers.DictField(required=False),
            'map_config': serializers.ListField(child=serializers.DictField(), required=False),
            'filter': serializers.DictField(required=False)}),
        parameters=[OpenApiParameter(name, OpenApiTypes.BOOL) for name in ('semantic', 'reranker', 'bestMatch',
                                                                          'verbose')]
        + [OpenApiParameter(name, OpenApiTypes.INT) for name in ('limit', 'offset', 'page')]
        + HEAVY_PARAMETERS + [NUM_RETURNED],
        responses={200: OpenApiResponse(MATCH_ENTRY, description=(
            "OCL's answer, one entry per row: in the request for a lexical call, else once the call ended "
            'within the wait (Content-Location names its task).')), **HEAVY_RESPONSES})
    def post(self, request):
        from concepts import services as service
        payload = service.validate_match(request.data, request.query_params)
        semantic = request.query_params.get('semantic', '').lower() in TRUTHY
        reranker = request.query_params.get('reranker', '').lower() in TRUTHY
        if not semantic and not reranker:
            # Lexical without rerank is cheap: no gate, no queue, no capacity headers. Its answer is made
            # as it is sent (streamed when large), so the process never holds it whole.
            self.check_rate_limits()
            answer = service.match_answer(payload, semantic=False, reranker=False)
            response = list_response(answer, answer.most_bytes(), request, echoed=('map_config', 'filter'))
            response['num_returned'] = str(answer.count)
            return response
        return self.submit(request, payload, semantic, reranker)


class RerankView(HeavyCallView):
    """POST /concepts/$rerank/: rerank candidate rows for a query; always a heavy call."""

    endpoint = RERANK

    @extend_schema(
        operation_id='concepts_rerank',
        request=inline_serializer('RerankRequest', {
            'q': serializers.CharField(), 'rows': serializers.ListField(child=serializers.DictField()),
            'name_key': serializers.CharField(required=False), 'score_key': serializers.CharField(required=False),
            'encoder_model': serializers.CharField(required=False)}),
        parameters=HEAVY_PARAMETERS,
        responses={200: OpenApiResponse(RERANKED_ROWS, description=(
            "OCL's answer: the rows, best first, each with its score (at search_meta.<score_key> when the row "
            'has search_meta, else at <score_key>).')), **HEAVY_RESPONSES})
    def post(self, request):
        from concepts import services as service
        body = service.validate_rerank_body(request.data)
        return self.submit(request, body, False, False)


class TaskView(StreamsStoredResults, APIView):
    """GET /tasks/<id>/ (optionally ?wait=N to long-poll) and DELETE to cancel. Owner and staff only."""

    permission_classes = (IsAuthenticated,)

    def get_call(self, request, call_id):
        call = Call.objects.select_related('work').filter(pk=call_id).first()
        # Anyone but the owner and staff gets the same 404 as for an id that doesn't exist.
        if call is None or not (call.owner_id == request.user.pk or request.user.is_staff):
            raise errors.exceptions.NotFound('No such task.')
        call.work = lifecycle.expire(call.work)
        return call

    @extend_schema(parameters=[OpenApiParameter('wait', OpenApiTypes.INT, description='Long-poll up to N s.'),
                               POLL_HINT],
                   responses={200: TASK, 404: ERROR})
    def get(self, request, call_id):
        call = self.get_call(request, call_id)
        wait = min(whole_param(request, 'wait', default=0), get_config().wait.max_seconds, MAX_POLL_SECONDS)
        if wait and not lifecycle.seen(call, call.work).finished:
            with submission.waiting_slot(request.user, wait, RequestFacts.from_meta(request.META), call.endpoint,
                                         call.rows) as allowed:
                if allowed:  # else this host's waiting slots are taken: answer now, the client polls
                    lifecycle.wait(call, wait)  # keeps the fields the answer shows up to date
        return task_response(call)

    @extend_schema(responses={200: TASK, 404: ERROR, 409: ERROR})
    def delete(self, request, call_id):
        call = self.get_call(request, call_id)
        was = lifecycle.cancel(call)
        if was is None:
            call.refresh_from_db()
            call.work.refresh_from_db()
            raise errors.Conflict(f'The task already ended ({lifecycle.seen(call, call.work).state}).')
        if was == State.RUNNING:
            # Answer once the work has stopped (its worker confirms); a worker the revoke didn't reach
            # stops it at its next heartbeat, and the answer doesn't wait for that.
            lifecycle.wait_stopped(call, CANCEL_WAIT_SECONDS)
        return task_response(call)


class MetricsView(APIView):
    """GET /metrics: Prometheus text. Open unless METRICS_TOKEN is set (then `Authorization: Bearer <it>`)."""

    authentication_classes = ()
    permission_classes = (AllowAny,)

    @extend_schema(responses={(200, 'text/plain'): OpenApiTypes.STR})
    def get(self, request):
        from django.conf import settings
        from django.http import HttpResponse
        from django.utils.crypto import constant_time_compare
        from prometheus_client import CONTENT_TYPE_LATEST

        from api.metrics import render
        token = settings.METRICS_TOKEN
        if token and not constant_time_compare(request.headers.get('Authorization', ''), f'Bearer {token}'):
            return HttpResponse('Send Authorization: Bearer <METRICS_TOKEN>.\n', status=401,
                                content_type='text/plain')
        return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
