"""WSGI entry point (gunicorn api.wsgi).

`ChunkedBody` lets a request sent with `Transfer-Encoding: chunked` (no Content-Length) reach Django with
its body: gunicorn decodes the chunks and says so with `wsgi.input_terminated`, but Django reads
CONTENT_LENGTH bytes, so such a body read as empty. The body is read here, up to MAX_REQUEST_BYTES + 1 (the
request size limit then refuses a larger one), and handed on with its length. Written by hand because
Django has no setting for it.
"""
import io
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')


class ChunkedBody:
    def __init__(self, app, limit):
        self.app = app
        self.limit = limit

    def __call__(self, environ, start_response):
        if (environ.get('wsgi.input_terminated') and not environ.get('CONTENT_LENGTH')
                and 'chunked' in environ.get('HTTP_TRANSFER_ENCODING', '').lower()):
            body = environ['wsgi.input'].read(self.limit + 1)
            environ['wsgi.input'] = io.BytesIO(body)
            environ['CONTENT_LENGTH'] = str(len(body))
        return self.app(environ, start_response)


def build():
    from django.conf import settings
    return ChunkedBody(get_wsgi_application(), settings.MAX_REQUEST_BYTES)


application = build()
