"""Refuse request bodies over MAX_REQUEST_BYTES with 413 before anything reads them."""
import json

from django.conf import settings
from django.http import HttpResponse


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
