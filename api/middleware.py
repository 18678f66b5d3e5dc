"""The first middlewares: the request id, then refusing request bodies over MAX_REQUEST_BYTES with 413
before anything reads them."""
import json

from django.conf import settings
from django.http import HttpResponse

from common import request_id


class RequestId:
    """Take the request id from X-Request-Id (when it is a plain token of at most 100 characters) or make
    one; bind it for every log line of the request, put it back in the request's META as the header's value
    (capacity.caller.RequestFacts reads it there: one source for the call's row and its log lines), and
    answer with it in X-Request-Id."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        rid = request_id.from_header(request.META.get('HTTP_X_REQUEST_ID'))
        request.META['HTTP_X_REQUEST_ID'] = rid
        with request_id.bound(rid):
            response = self.get_response(request)
        response['X-Request-Id'] = rid
        return response


class RequestSizeLimit:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get('CONTENT_LENGTH') or 0)
        except ValueError:
            length = 0
        limit = settings.MAX_REQUEST_BYTES
        if length > limit:
            body = {'detail': f'The request body is {length} bytes; at most {limit} are accepted.',
                    'error_code': 'request_too_large'}
            return HttpResponse(json.dumps(body), status=413, content_type='application/json')
        return self.get_response(request)
