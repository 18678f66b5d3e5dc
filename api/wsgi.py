"""WSGI entry point (gunicorn api.wsgi).

`ChunkedBody` lets a request sent with `Transfer-Encoding: chunked` (no Content-Length) reach Django with
its body: gunicorn decodes the chunks and says so with `wsgi.input_terminated`, but Django reads
CONTENT_LENGTH bytes, so such a body read as empty. The body is read here, up to MAX_REQUEST_BYTES + 1 (the
request size limit then refuses a larger one), and handed on with its length. Written by hand because
Django has no setting for it.

`warm()` runs once in each API process before gunicorn lets it accept a request: it resolves the URLconf
(importing every view, DRF's renderers and drf-spectacular) and imports the matching service the heavy
views call, which brings in SciPy. Left to the first requests, that cost about 0.45 s on an idle machine
and 0.6–0.8 s to each of the first calls of a process under load, since every thread that arrives during
the import waits on it (bench/latency.py's slowest calls were all a run's first). Imports only: no
database or Redis, so a process still starts, and answers its readiness check, while those are down.

Then `gc.freeze()`, as a lane worker does once its indexes are loaded (workers.signals.warm_indexes): what
is loaded by now (Django, DRF, SciPy, every view) is never scanned by the garbage collector again. A full
collection walked its ~108,000 objects in about 60 ms, and on a busy host twice that: under a bulk flood
every request of the process waited it out at once (bench/flood.py, the lexical `$match` and `/healthz`
trickles' one slow moment, docs/benchmarks.md).
"""
import gc
import importlib
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


def warm():
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - the property imports the URLconf and every view in it
    importlib.import_module('concepts.services')  # the heavy views import it at their first call


def build():
    from django.conf import settings
    application = ChunkedBody(get_wsgi_application(), settings.MAX_REQUEST_BYTES)
    warm()
    gc.freeze()
    return application


application = build()
