"""A stored result (workers.lifecycle.StoredJSON) goes out as it is stored, in slices, never parsed again.

A succeeded call's answer is its work's stored JSON text: as the whole body (the in-request answer) or as
the `result` of its task (`GET /tasks/<id>/`). Parsed, rendered again and copied into the response, a 32 MB
answer (the largest MAX_ANSWER_BYTES admits) took an API process hundreds of MB per read, which it kept.
`StreamsStoredResults` streams a text longer than RESULT_SLICE_CHARACTERS (4 MiB) after the rest of the
body, one slice read from the database at a time (StreamingHttpResponse; no Content-Length, so chunked);
a shorter one goes out whole, written verbatim by `JSONRenderer`, as it is wherever such a body is rendered
whole (the browsable API). DRF has no way to embed JSON text in a body, hence these.
"""
from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework import renderers
from rest_framework.response import Response

from workers.lifecycle import StoredJSON


def split(data):
    """(bytes before, the StoredJSON, bytes after) of a body that holds a stored result, else None."""
    if isinstance(data, StoredJSON):
        return b'', data, b''
    if isinstance(data, dict) and isinstance(data.get('result'), StoredJSON):
        rest = {name: value for name, value in data.items() if name != 'result'}
        head = renderers.JSONRenderer().render(rest)
        return head[:-1] + (b',' if rest else b'') + b'"result":', data['result'], b'}'
    return None


def encoded(before, stored, after):
    yield before
    for part in stored.slices():
        yield part.encode()
    yield after


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        parts = split(data)
        if parts is None:
            return super().render(data, accepted_media_type, renderer_context)
        return b''.join(encoded(*parts))


class StreamsStoredResults:
    """A view mixin: a JSON answer that holds a long stored result is streamed (headers and status kept)."""

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if not isinstance(response, Response) or not isinstance(getattr(response, 'accepted_renderer', None),
                                                                 JSONRenderer):
            return response
        parts = split(response.data)
        if parts is None or len(parts[1]) <= settings.RESULT_SLICE_CHARACTERS:
            return response
        streamed = StreamingHttpResponse(encoded(*parts), status=response.status_code,
                                         content_type='application/json')
        for name, value in response.items():
            if name.lower() != 'content-type':
                streamed[name] = value
        return streamed
