"""gunicorn's logger in the service's JSON format (common.jsonlog):
`--logger-class api.gunicorn_logging.JsonLogger`.

The error log's lines get the JSON formatter; each access line is one JSON object with the request's
fields, its request id taken from the response's X-Request-Id (api.middleware.RequestId sets it on every
response, from the request's header or a new one). No Django import: gunicorn's master loads this before
the application.
"""
from gunicorn import glogging

from common.jsonlog import ContextFilter, JsonFormatter


class JsonLogger(glogging.Logger):
    def setup(self, cfg):
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(JsonFormatter())
                handler.addFilter(ContextFilter())

    def access(self, resp, req, environ, request_time):
        if not self.access_log_enabled:
            return
        atoms = self.atoms(resp, req, environ, request_time)
        try:
            self.access_log.info('%s %s %s', atoms['m'], atoms['U'], atoms['s'], extra={
                'method': atoms['m'], 'path': atoms['U'], 'query': atoms['q'] or None,
                'status': resp.status_code,
                'duration_ms': round(request_time.total_seconds() * 1000, 1),
                'bytes': atoms['B'], 'remote_addr': atoms['h'], 'user_agent': atoms['a'],
                'request_id': atoms.get('{x-request-id}o') or atoms.get('{x-request-id}i') or None,
            })
        except Exception:  # noqa: BLE001 - as gunicorn's own: a broken access line never fails a request
            self.exception('Access log line failed')
