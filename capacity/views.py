"""Staff endpoints for the capacity config. The work is in capacity.config; these only translate HTTP."""
from django.core.exceptions import ValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from capacity.config import get_current, get_defaults, get_history, save_config, version_data
from capacity.constants import SOURCE_API

DEFAULT_HISTORY_LIMIT = 50


def to_int(value, default):
    """`value` as an int; `default` when it is missing, 0 or not a number."""
    try:
        return int(value) or default
    except (TypeError, ValueError):
        return default


class CapacityConfigView(APIView):
    """GET the config in force and the defaults; PATCH merges a change into it; PUT replaces it."""

    permission_classes = (IsAdminUser,)
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


class CapacityConfigHistoryView(APIView):
    """GET the newest versions first (`?limit=N`, default 50, at most 500), each with its changes."""

    permission_classes = (IsAdminUser,)

    @extend_schema(parameters=[OpenApiParameter('limit', OpenApiTypes.INT, description='1 to 500, default 50')],
                   responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        return Response(get_history(to_int(request.query_params.get('limit'), DEFAULT_HISTORY_LIMIT)))


class CapacityStatusView(APIView):
    """GET: lanes with in-flight leases and limits, queues with depth, age and pools, Redis health."""

    permission_classes = (IsAdminUser,)

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        from capacity.status import get_status  # reads Redis; only this view needs it
        return Response(get_status(get_current()[1]))
