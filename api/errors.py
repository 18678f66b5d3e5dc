"""The API's error bodies: every error carries `detail` and an `error_code` clients can switch on.

DRF's exception handler does the work; this adds `error_code` (and `retry_after` for a rate limit) so a
rate-limit 429 (`rate_limited`) can be told from a capacity 429 (`capacity_exceeded`). What Django answers
itself (a path no view serves, a bad Host header, an exception no view handled) has the same shape through
the handlers api/urls.py names; Django uses them with DEBUG off, which is the default (api/settings.py).
"""
import logging

from django.db import DataError
from django.http import JsonResponse
from rest_framework import exceptions
from rest_framework.views import exception_handler

from common.database import DATABASE_DOWN

logger = logging.getLogger('heavy_lanes')

CODES = {
    exceptions.Throttled: 'rate_limited',
    exceptions.ValidationError: 'invalid',
    exceptions.ParseError: 'malformed_request',
    exceptions.NotAuthenticated: 'not_authenticated',
    exceptions.AuthenticationFailed: 'authentication_failed',
    exceptions.PermissionDenied: 'permission_denied',
    exceptions.NotFound: 'not_found',
    exceptions.MethodNotAllowed: 'method_not_allowed',
    exceptions.UnsupportedMediaType: 'unsupported_media_type',
}


SERVICE_RETRY_SECONDS = 5  # the Retry-After of a 503



class Conflict(exceptions.APIException):
    status_code = 409
    default_detail = 'The request conflicts with the current state.'
    default_code = 'conflict'


class Unprocessable(exceptions.APIException):
    status_code = 422
    default_detail = 'The request can not be processed.'
    default_code = 'idempotency_conflict'


class ServiceUnavailable(exceptions.APIException):
    status_code = 503
    default_detail = 'The service is unavailable; please retry shortly.'
    default_code = 'queue_unavailable'


class DatabaseUnavailable(ServiceUnavailable):
    default_detail = 'The database could not record this request; nothing was changed. Please retry shortly.'
    default_code = 'database_unavailable'


def handle(exc, context):
    if isinstance(exc, DataError):
        # A value the database can't store (too long, out of range, NUL): the request's fault, not an outage.
        # Validation refuses every such value it knows with the field's name; this is the net under it.
        logger.warning('Input the database could not store, answering %s: %s',
                       getattr(context.get('request'), 'path', '?'), str(exc).splitlines()[0] if str(exc) else exc)
        exc = exceptions.ValidationError({'detail': 'A value in the request can not be stored: '
                                                    + (str(exc).splitlines()[0][:200] if str(exc) else 'invalid')})
    if isinstance(exc, DATABASE_DOWN):
        # A write refused (disk full, read-only) or a lost connection: say what failed, not "queue down".
        logger.error('Database error answering %s: %s: %s', getattr(context.get('request'), 'path', '?'),
                     type(exc).__name__, exc)
        exc = DatabaseUnavailable()
    response = exception_handler(exc, context)
    if response is None:
        return None
    data = response.data if isinstance(response.data, dict) and 'detail' in response.data else {
        'detail': response.data}
    code = next((code for kind, code in CODES.items() if isinstance(exc, kind)), None)
    if code is None:
        code = getattr(exc, 'default_code', 'error')
    data['error_code'] = code
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        data['retry_after'] = int(exc.wait + 0.999)
    if isinstance(exc, ServiceUnavailable):
        response['Retry-After'] = str(SERVICE_RETRY_SECONDS)
    response.data = data
    return response


def _django_error(status, detail, code):
    return JsonResponse({'detail': detail, 'error_code': code}, status=status)


def bad_request(request, exception=None):
    return _django_error(400, 'Bad request.', 'bad_request')


def permission_denied(request, exception=None):
    return _django_error(403, 'You do not have permission to perform this action.', 'permission_denied')


def not_found(request, exception=None):
    return _django_error(404, 'Not found.', 'not_found')


def server_error(request):
    # Django has logged the exception (logger django.request, with the request id) before calling this.
    return _django_error(500, 'A server error occurred; it was logged with this request\'s X-Request-Id.',
                         'server_error')
