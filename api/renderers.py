"""A stored result (workers.lifecycle.StoredJSON) goes out as it is stored, in slices, never parsed again.

A succeeded call's answer is its work's stored JSON text: as the whole body (the in-request answer) or as
the `result` of its task (`GET /tasks/<id>/`). Parsed, rendered again and copied into the response, a 32 MB
answer (the largest MAX_ANSWER_BYTES admits) took an API process hundreds of MB per read, which it kept.
`StreamsStoredResults` streams a text longer than RESULT_SLICE_CHARACTERS (4 MiB) after the rest of the
body, one slice read from the database at a time (StreamingHttpResponse; no Content-Length, so chunked);
a shorter one goes out whole, written verbatim by `JSONRenderer`, as it is wherever such a body is rendered
whole (the browsable API). DRF has no way to embed JSON text in a body, hence these.

A lexical `$match` answer is made in the request (concepts.services.MatchAnswer): one whose size could pass
RESULT_SLICE_CHARACTERS is streamed an entry at a time (`streamed_list`), the same bytes as JSONRenderer
renders the whole list, so an API process holds one entry, not the answer (16 answers of 29.5 MB at once,
rendered whole, took the two API processes from 108 MB to 545 and 476 MB and they kept most of it; streamed,
to 122 and 124 MB: docs/benchmarks.md).
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


STREAM_CHUNK_BYTES = 64 * 1024  # entries are sent in pieces of at least this much (fewer, larger writes)


def streamed_list(items, echoed=()):
    """The bytes of the JSON list of the dicts `items`, exactly as JSONRenderer renders the list whole, in
    pieces of about STREAM_CHUNK_BYTES, each item rendered as it comes. A value under a key of `echoed`
    is rendered once for as long as items carry the same object there (OCL's `$match` echoes `map_config`
    and `filter` in every entry)."""
    render = renderers.JSONRenderer().render

    def rendered(value):
        return render(value) if value is not None else b'null'  # JSONRenderer renders None as no body
    known = {}  # key -> (the value, its bytes)
    piece = bytearray(b'[')
    for number, item in enumerate(items):
        if number:
            piece += b','
        piece += b'{'
        for index, (key, value) in enumerate(item.items()):
            if key in echoed:
                if key not in known or known[key][0] is not value:
                    known[key] = (value, rendered(value))
                text = known[key][1]
            else:
                text = rendered(value)
            piece += (b',' if index else b'') + rendered(key) + b':' + text
        piece += b'}'
        if len(piece) >= STREAM_CHUNK_BYTES:
            yield bytes(piece)
            piece.clear()
    piece += b']'
    yield bytes(piece)


def list_response(items, most_bytes, request, echoed=()):
    """The 200 of a JSON list made as it is read (`items`, an iterable of dicts): streamed when it could
    take more than RESULT_SLICE_CHARACTERS bytes (`most_bytes`, an upper bound) and the client takes JSON,
    else rendered whole (with its Content-Length), as any answer."""
    if most_bytes <= settings.RESULT_SLICE_CHARACTERS or not isinstance(
            getattr(request, 'accepted_renderer', None), JSONRenderer):
        return Response(list(items))
    return StreamingHttpResponse(streamed_list(items, echoed), content_type='application/json')


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
