"""Staff endpoints for the capacity config. The work is in capacity.config; these only translate HTTP.

They take the API's token and, for the staff lanes page (capacity.dashboard), Django's session login (the
admin's login page), whose writes DRF's SessionAuthentication makes carry a CSRF token. The token comes
first, so an anonymous request is answered 401 with `WWW-Authenticate: Token`, as everywhere in the API.
"""
from django.core.exceptions import ValidationError
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAdminUser
from rest_framework.renderers import JSONRenderer, TemplateHTMLRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from capacity.config import MAX_HISTORY, get_current, get_defaults, get_history, save_config, version_data
from capacity.constants import SOURCE_API
from common.numbers import whole_number

DEFAULT_HISTORY_LIMIT = 50
STAFF_AUTHENTICATION = (*api_settings.DEFAULT_AUTHENTICATION_CLASSES, SessionAuthentication)


class StaffView(APIView):
    """A staff-only endpoint (IsAdminUser: 401 anonymous, 403 non-staff), by token or session."""

    authentication_classes = STAFF_AUTHENTICATION
    permission_classes = (IsAdminUser,)


def whole_param(request, name, default, high):
    """The query parameter `name` as an int from 1 to `high`, `default` when it is absent or empty; anything
    else (0, a sign, a digit outside ASCII: '²', '٣') is a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None or raw == '':
        return default
    value = whole_number(raw)
    if value is None or not 1 <= value <= high:
        raise exceptions.ValidationError({name: [f'Must be a whole number from 1 to {high}, in ASCII digits.']})
    return value


class CapacityConfigView(StaffView):
    """GET the config in force and the defaults; PATCH merges a change into it; PUT replaces it."""

    # The project's JSON parser (REST_FRAMEWORK's, api.parsers: it refuses what the database can't store, such
    # as a NUL in the note) and no other: a form body can't express numbers or nested settings.
    parser_classes = tuple(parser for parser in api_settings.DEFAULT_PARSER_CLASSES
                           if parser.media_type == 'application/json')

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        latest, config = get_current()
        return Response({**version_data(latest), 'config': config.to_json(), 'defaults': get_defaults()})

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT})
    def patch(self, request):
        return self.save(request, replace=False)

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT})
    def put(self, request):
        """Settings left out of the body take their defaults."""
        return self.save(request, replace=True)

    def save(self, request, replace):
        if not isinstance(request.data, dict):
            return Response({'detail': 'Send a JSON object.'}, status=400)
        changes = dict(request.data)
        note = changes.pop('note', '')
        if not isinstance(note, str):
            return Response({'detail': '"note" must be a string.'}, status=400)
        try:
            row, config, changed = save_config(
                changes, user=request.user, source=SOURCE_API, note=note, replace=replace)
        except ValidationError as ex:
            return Response({'detail': ex.messages}, status=400)
        return Response({**version_data(row), 'config': config.to_json(), 'changes': changed})


class CapacityConfigHistoryView(StaffView):
    """GET the newest versions first (`?limit=N`, default 50, at most 500), each with its changes."""

    @extend_schema(parameters=[OpenApiParameter('limit', OpenApiTypes.INT, description='1 to 500, default 50')],
                   responses={200: {'type': 'array', 'items': {'type': 'object', 'additionalProperties': True}}})
    def get(self, request):
        return Response(get_history(whole_param(request, 'limit', DEFAULT_HISTORY_LIMIT, MAX_HISTORY)))


class CapacityStatusView(StaffView):
    """GET: lanes with in-flight leases and limits, queues with depth, age and pools, Redis health."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        from capacity.status import get_status  # reads Redis; only this view needs it
        return Response(get_status(get_current()[1]))


class CapacityDecisionsView(StaffView):
    """GET the gated calls' decisions per minute over the last hour (`?minutes=N`, 1 to 60, default 60),
    oldest minute first: `{"redis": "ok", "series": [{"minute": <epoch s>, "decisions": {decision: n}}]}`;
    a Redis that doesn't answer gives `redis: '<error>'` and no series, as the status does."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, parameters=[
        OpenApiParameter('minutes', OpenApiTypes.INT, description='1 to 60, default 60')])
    def get(self, request):
        from capacity import counters  # reads Redis; only this view needs it
        from capacity.store import Unknown
        minutes = whole_param(request, 'minutes', counters.SERIES_MINUTES, counters.SERIES_MINUTES)
        series = counters.decisions_per_minute(minutes)
        if isinstance(series, Unknown):  # like the status: report a broken Redis, don't fail
            return Response({'redis': series.error, 'series': []})
        return Response({'redis': 'ok', 'series': series})


class DashboardRenderer(TemplateHTMLRenderer):
    """The lanes page; a refusal (401, 403) is a short page that says why and links to the login."""

    template_name = 'capacity/dashboard.html'
    exception_template_names = ('capacity/refused.html',)


class CapacityDashboardView(StaffView):
    """GET /capacity/dashboard/: the staff lanes page (HTML). It draws what the endpoints above answer,
    refreshed every REFRESH_SECONDS by its script (capacity/static/capacity/dashboard.js), and changes
    the config through PATCH /capacity/config/ like any staff client. Asked for JSON, it answers what
    the page is given: the URLs it reads and its refresh interval."""

    renderer_classes = (DashboardRenderer, JSONRenderer)
    REFRESH_SECONDS = 3

    @extend_schema(exclude=True)  # a page for people, not part of the HTTP contract
    def get(self, request):
        return Response({
            'user': request.user.get_username(),
            'refresh_seconds': self.REFRESH_SECONDS,
            'urls': {'status': reverse('capacity-status'), 'config': reverse('capacity-config'),
                     'history': reverse('capacity-config-history'),
                     'decisions': reverse('capacity-decisions')},
        })
