"""The caller's calls as a list and by run, and a call sent again (api.views has one call's handle).

- `GET /tasks/`: the caller's calls (staff: everyone's, or one user's with `?user=<username>`), newest
  first, filtered by `state` (one or several, comma-separated), `endpoint` and `run` (the `automatch_run_id`
  the client sent in X-OCL-Event-Metadata), in DRF's pages (`count`, `next`, `previous`, `results`). Each
  entry is the call's GET /tasks/<id>/ body without `result` (a page of 32 MB answers is no list): the
  result is read at the entry's `url`.
- `DELETE /tasks/?run=<id>`: cancels every open call of that run of the caller, each as DELETE
  /tasks/<id>/ cancels one (workers.runs.cancel_run), and answers `{"cancelled": N}`.
- `POST /tasks/<id>/retry/`: a failed, expired or cancelled call of the caller sent again as a new call
  (new id; the same endpoint, payload and parameters), served by the same submission code as any heavy
  call and answered as a submission is (202 + Location, 200 after a wait, 429...); 409 for a call that is
  queued, running or succeeded.
"""
import dataclasses

from django.contrib.auth import get_user_model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from api import errors
from api.params import whole_param
from api.schema import ERROR, HEAVY_PARAMETERS, HEAVY_RESPONSES, TASK_SUMMARY
from api.views import CANCEL_WAIT_SECONDS, HeavyCallView, task_body
from capacity.caller import MAX_RUN_CHARS, RequestFacts
from capacity.constants import MATCH, RERANK
from workers import idempotency, lifecycle, runs
from workers.models import Call, State

ENDPOINTS = (MATCH, RERANK)


class CallPages(PageNumberPagination):
    """DRF's page-number pages of 20 calls; `page_size` up to 100. A page or size that isn't a whole number
    in range is a 400 naming it (DRF would fall back to the default size, or answer 404)."""

    page_size = 20
    page_size_query_param = 'page_size'
    max_page_size = 100

    def paginate_queryset(self, queryset, request, view=None):
        # Checked here, in ASCII digits: DRF reads them with int(), which takes '٣' as 3 and fails on '²'.
        whole_param(request, 'page', low=1)
        whole_param(request, 'page_size', low=1, high=self.max_page_size)
        try:
            return super().paginate_queryset(queryset, request, view)
        except errors.exceptions.NotFound as ex:
            raise errors.exceptions.ValidationError({'page': [str(ex.detail)]}) from None


def run_param(request, required=False):
    """The `run` query parameter: a client's run id as it sent it (the API keeps it whole), or None."""
    run = request.query_params.get('run')
    if run is None or run == '':
        if required:
            raise errors.exceptions.ValidationError({'run': ['Name the run to cancel: ?run=<automatch_run_id>.']})
        return None
    if len(run) > MAX_RUN_CHARS:  # no call has one: its submission was a 400
        raise errors.exceptions.ValidationError({'run': [f'At most {MAX_RUN_CHARS} characters.']})
    if '\x00' in run:  # no call has one either (RequestFacts reads it as no run), and no database takes it
        raise errors.exceptions.ValidationError({'run': ['A run id holds no NUL character.']})
    return run


def states_param(request):
    raw = request.query_params.get('state')
    if not raw:
        return []
    states = [part.strip() for part in raw.split(',') if part.strip()]
    unknown = [state for state in states if state not in State.values]
    if unknown or not states:
        raise errors.exceptions.ValidationError({'state': [f'Unknown state {", ".join(unknown) or raw!r}; one '
                                                           f'or more of {", ".join(State.values)}.']})
    return states


def endpoint_param(request):
    endpoint = request.query_params.get('endpoint')
    if not endpoint:
        return None
    if endpoint not in ENDPOINTS:
        raise errors.exceptions.ValidationError({'endpoint': [f'One of {", ".join(ENDPOINTS)}.']})
    return endpoint


def owner_param(request):
    """Whose calls: the caller's; staff's everyone's, or those of `?user=<username>`."""
    username = request.query_params.get('user')
    if not request.user.is_staff:
        if username and username != request.user.get_username():
            raise errors.exceptions.PermissionDenied("Only staff list other users' calls.")
        return request.user
    if not username:
        return None
    owner = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    if owner is None:
        raise errors.exceptions.ValidationError({'user': [f'No user {username!r}.']})
    return owner


FILTERS = [
    OpenApiParameter('state', OpenApiTypes.STR, description='One or more states, comma-separated: '
                     + ', '.join(State.values) + '.'),
    OpenApiParameter('endpoint', OpenApiTypes.STR, enum=list(ENDPOINTS)),
    OpenApiParameter('run', OpenApiTypes.STR, description='The `automatch_run_id` the calls were sent with '
                     f'(X-OCL-Event-Metadata), exactly as sent: at most {MAX_RUN_CHARS} characters.'),
    OpenApiParameter('user', OpenApiTypes.STR, description="Staff: one user's calls (a username)."),
    OpenApiParameter('page', OpenApiTypes.INT), OpenApiParameter('page_size', OpenApiTypes.INT,
                                                                 description='1 to 100; 20 by default.'),
]
PAGE = inline_serializer('TaskPage', {
    'count': serializers.IntegerField(), 'next': serializers.URLField(allow_null=True),
    'previous': serializers.URLField(allow_null=True), 'results': TASK_SUMMARY})


class TaskListView(APIView):
    """GET /tasks/ (the caller's calls, filtered, in pages) and DELETE /tasks/?run=<id> (cancel a run)."""

    permission_classes = (IsAuthenticated,)

    @extend_schema(operation_id='tasks_list', parameters=FILTERS,
                   responses={200: PAGE, 400: OpenApiResponse(ERROR, description='A bad filter; `detail` '
                                                              'names it.'), 403: ERROR})
    def get(self, request):
        calls = runs.listed(owner=owner_param(request), states=states_param(request),
                            endpoint=endpoint_param(request), run=run_param(request))
        pages = CallPages()
        page = pages.paginate_queryset(calls, request, view=self)
        for call in page:
            call.work = lifecycle.expire(call.work)  # past its queue deadline: shown as it will end
        return pages.get_paginated_response([task_body(call, with_result=False) for call in page])

    @extend_schema(operation_id='tasks_cancel_run',
                   parameters=[OpenApiParameter('run', OpenApiTypes.STR, required=True,
                                                description='The run whose open calls to cancel.')],
                   responses={200: inline_serializer('RunCancelled', {'cancelled': serializers.IntegerField()}),
                              400: OpenApiResponse(ERROR, description='No `run`, or a bad one.')})
    def delete(self, request):
        done = runs.cancel_run(request.user, run_param(request, required=True), CANCEL_WAIT_SECONDS)
        return Response({'cancelled': done.count})


class RetryView(HeavyCallView):
    """POST /tasks/<id>/retry/: the caller's failed, expired or cancelled call, sent again as a new call."""

    @extend_schema(operation_id='tasks_retry', request=None, parameters=HEAVY_PARAMETERS, responses={
        200: OpenApiResponse(OpenApiTypes.ANY, description='The endpoint\'s answer, once the new call ended '
                                                           'within the wait (as POST of that endpoint).'),
        **HEAVY_RESPONSES, 404: ERROR,
        409: OpenApiResponse(ERROR, description='The call is queued, running or succeeded.')})
    def post(self, request, call_id):
        from concepts import services as service
        call = Call.objects.select_related('work').filter(pk=call_id, owner=request.user).first()
        if call is None:
            raise errors.exceptions.NotFound('No such task.')  # another's call is no call of the caller's
        call.work = lifecycle.expire(call.work)
        state = lifecycle.seen(call, call.work).state
        if state not in runs.RETRYABLE:
            raise errors.Conflict(f'The task is {state}: only a failed, expired or cancelled task is sent again.')
        work = call.work
        self.endpoint = call.endpoint
        # The sources may have changed since: a payload that no longer holds is the endpoint's 400, now.
        if call.endpoint == MATCH:
            service.validate_payload(work.payload)
        else:
            service.validate_rerank_body(work.payload)
        facts = RequestFacts.from_meta(request.META)
        if facts.automatch_run_id is None and call.run_id:
            facts = dataclasses.replace(facts, automatch_run_id=call.run_id)  # it stays in its run
        self.retried = call.pk
        return self.submit(request, work.payload, work.semantic, work.reranker, facts=facts)

    def key_of(self, request):
        """The request's Idempotency-Key in the retried call's scope (workers.idempotency.retry_key): a retry
        sent with its original call's key is a new call, and the same retry sent again is that one."""
        return idempotency.retry_key(self.retried, super().key_of(request))

