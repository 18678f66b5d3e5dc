"""The OpenAPI schema's parts the views declare (bodies, response headers, parameters), and its
post-processing: keep the `$` of `/concepts/$match/` and `/concepts/$rerank/`.

The schema generator reads paths as regexes and drops `$` as an end-of-line anchor; these routes are plain
paths where `$` is part of the name (the FHIR-style operation names clients already use).
"""
from django.urls import get_resolver
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, inline_serializer
from rest_framework import serializers

from capacity import constants
from workers.models import State


def dollar_routes():
    """{path as the generator writes it: path as routed} for every route with a `$` in its name."""
    routes = {}
    for pattern in get_resolver().url_patterns:
        route = str(pattern.pattern)
        if '$' in route:
            routes['/' + route.replace('$', '')] = '/' + route
    return routes


def restore_dollar_paths(result, generator, request, public):
    renamed = dollar_routes()
    result['paths'] = {renamed.get(path, path): item for path, item in result['paths'].items()}
    return result


HANDLE = inline_serializer('TaskHandle', {
    'id': serializers.CharField(), 'state': serializers.CharField(), 'endpoint': serializers.CharField(),
    'lane': serializers.CharField(), 'url': serializers.CharField(),
    'created_at': serializers.DateTimeField(),
    'estimated_start_at': serializers.DateTimeField(allow_null=True),
    'estimated_finish_at': serializers.DateTimeField(allow_null=True)})
PROGRESS = inline_serializer('TaskProgress', {
    'rows_done': serializers.IntegerField(), 'rows_total': serializers.IntegerField()}, required=False,
    help_text='While running: the rows its run has done, written at least every second or tenth of them.')


def task_fields():
    return {
        'id': serializers.CharField(), 'state': serializers.ChoiceField(choices=State.values),
        'endpoint': serializers.CharField(), 'lane': serializers.CharField(), 'url': serializers.CharField(),
        'created_at': serializers.DateTimeField(), 'started_at': serializers.DateTimeField(allow_null=True),
        'finished_at': serializers.DateTimeField(allow_null=True),
        'estimated_start_at': serializers.DateTimeField(allow_null=True),
        'estimated_finish_at': serializers.DateTimeField(allow_null=True),
        'position': serializers.IntegerField(required=False, help_text='While queued: its place in its queue.'),
        'progress': PROGRESS, 'error': serializers.CharField(required=False)}


TASK = inline_serializer('Task', {**task_fields(), 'result': serializers.JSONField(required=False)})
# An entry of GET /tasks/: a task without its result (read at its `url`).
TASK_SUMMARY = inline_serializer('TaskSummary', task_fields(), many=True)
CAPACITY_REFUSAL = inline_serializer('CapacityRefusal', {
    'detail': serializers.CharField(), 'error_code': serializers.ChoiceField(choices=['capacity_exceeded']),
    'scope': serializers.CharField(allow_null=True, help_text='The full lane (a paused one first).'),
    'paused': serializers.BooleanField(help_text="True when the lane's limit is 0: waiting won't clear it."),
    'retry_after': serializers.IntegerField(help_text='Seconds, as Retry-After.')})
RATE_LIMITED = inline_serializer('RateLimited', {
    'detail': serializers.CharField(), 'error_code': serializers.ChoiceField(choices=['rate_limited']),
    'retry_after': serializers.IntegerField(help_text='Seconds, as Retry-After.')})
# A 429 is either body, told apart by `error_code` (one schema matches each: their codes differ).
REFUSAL = PolymorphicProxySerializer('Refusal', [CAPACITY_REFUSAL, RATE_LIMITED], resource_type_field_name=None)
ERROR = inline_serializer('Error', {'detail': serializers.JSONField(), 'error_code': serializers.CharField()})
SEARCH_META = inline_serializer('SearchMeta', {
    'search_score': serializers.FloatField(), 'search_rerank_score': serializers.FloatField(allow_null=True),
    'search_confidence': serializers.CharField(), 'search_highlight': serializers.DictField(),
    'match_type': serializers.ChoiceField(choices=['very_high', 'high', 'medium', 'low']),
    'search_normalized_score': serializers.FloatField(), 'algorithm': serializers.CharField()})
MATCHED_CONCEPTS = inline_serializer('MatchedConcept', {
    'id': serializers.CharField(), 'type': serializers.CharField(), 'url': serializers.CharField(),
    'version_url': serializers.CharField(), 'retired': serializers.BooleanField(),
    'display_name': serializers.CharField(), 'search_meta': SEARCH_META}, many=True)
MATCH_ENTRY = inline_serializer('MatchEntry', {
    'row': serializers.DictField(), 'results': MATCHED_CONCEPTS,
    'map_config': serializers.ListField(child=serializers.DictField()), 'filter': serializers.DictField()},
    many=True)
RERANKED_ROWS = {'type': 'array', 'items': {'type': 'object', 'additionalProperties': True}}
HEAVY_RESPONSES = {
    202: OpenApiResponse(HANDLE, description='Queued: poll the Location (/tasks/<id>/).'),
    400: OpenApiResponse(ERROR, description='Invalid body; `detail` names the field.'),
    422: OpenApiResponse(ERROR, description='Idempotency-Key reused with another payload.'),
    429: OpenApiResponse(REFUSAL, description='Capacity refused (`capacity_exceeded`, Retry-After) or rate '
                                              'limited (`rate_limited`).'),
    503: OpenApiResponse(ERROR, description='The work queue is unavailable; nothing was submitted.'),
}


def response_header(name, codes, description, kind=OpenApiTypes.STR):
    """A header the answers with these status codes carry (docs/api.md describes each)."""
    return OpenApiParameter(name, kind, OpenApiParameter.HEADER, description=description,
                            response=list(codes))


GATED = (200, 202, 429)  # the answers of a gated call (not in `off` mode) carry the capacity headers
HEAVY_RESPONSE_HEADERS = [
    response_header('Location', [202], 'The task handle to poll: `/tasks/<id>/`.'),
    response_header('Content-Location', [200, 400, 503], 'The task that answered, when the call ran as one '
                                                         '(`/tasks/<id>/`; not on a lexical `$match`).'),
    response_header('Retry-After', [202, 429, 503], 'Seconds: when to poll the handle (202), retry a refused '
                                                    'call (429), or retry at all (503).', OpenApiTypes.INT),
    response_header('Preference-Applied', [200, 202], 'The `Prefer` preferences honoured: `respond-async`, '
                                                      '`wait=N` (RFC 7240).'),
    response_header('RateLimit-Policy', GATED, 'The lanes this call took and the rate limit, as IETF '
                                               'RateLimit policies (`q`, `qu`, `w`, `pk`).'),
    response_header('RateLimit', GATED, 'What is left of each policy after this call (`r`), and for a full '
                                        'one the seconds until it frees up (`t`).'),
    response_header(constants.HEADER_DECISION, GATED,
                    '`admitted`, `shadow-refused`, `refused`, `unavailable`, `coalesced` or `cached`.'),
    response_header(constants.HEADER_LIMIT, GATED,
                    "The `api_heavy` lane's limit for this call (bulk: less the single-row reserve).",
                    OpenApiTypes.INT),
    response_header(constants.HEADER_IN_FLIGHT, GATED, 'Leases in the `api_heavy` lane.', OpenApiTypes.INT),
    response_header(constants.HEADER_TIER, GATED, "The caller's tier."),
    response_header(constants.HEADER_TIER_LIMIT, GATED, "The tier's limit.", OpenApiTypes.INT),
    response_header(constants.HEADER_TIER_IN_FLIGHT, GATED, "Leases in the tier's lane.", OpenApiTypes.INT),
    response_header(constants.HEADER_SUGGESTED, GATED, 'How many calls this user should keep in flight now.',
                    OpenApiTypes.INT),
]
HEAVY_PARAMETERS = [
    OpenApiParameter('Idempotency-Key', OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description='Same key and payload return the same task handle.'),
    OpenApiParameter('Prefer', OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description='`respond-async` or `wait=N` (seconds, capped by config).'),
    OpenApiParameter('X-OCL-Event-Metadata', OpenApiTypes.STR, OpenApiParameter.HEADER,
                     description='JSON object; `"capacity_aware": "true"` opts in to enforced 429s.'),
    *HEAVY_RESPONSE_HEADERS,
]
POLL_HINT = response_header('Retry-After', [200], 'While the call is unfinished: seconds until it is '
                            'expected to finish (when to poll again).', OpenApiTypes.INT)
NUM_RETURNED = response_header('num_returned', [200], "OCL's count of the candidates in the answer, all "
                               'rows together.', OpenApiTypes.INT)
