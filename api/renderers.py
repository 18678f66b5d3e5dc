"""DRF's JSON renderer, writing a stored result (workers.lifecycle.StoredJSON) into the answer as it is stored.

A succeeded call's answer is its work's stored JSON text: as the whole body (the in-request answer) or as
the `result` of its task (`GET /tasks/<id>/`). Parsed and rendered again, a 10 MB `$match` answer took an
API process about four times its size at once, in every process serving one; written verbatim it takes the
text and its bytes. DRF has no way to embed JSON text in a rendered body, hence this small subclass.
"""
from rest_framework import renderers

from workers.lifecycle import StoredJSON


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, StoredJSON):
            return data.encode()
        if isinstance(data, dict) and isinstance(data.get('result'), StoredJSON):
            rest = {name: value for name, value in data.items() if name != 'result'}
            head = super().render(rest, accepted_media_type, renderer_context)
            separator = b',' if rest else b''
            return head[:-1] + separator + b'"result":' + data['result'].encode() + b'}'
        return super().render(data, accepted_media_type, renderer_context)
