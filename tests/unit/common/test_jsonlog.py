"""The request id's validation and the JSON log format every process writes. Pure: no services."""
import json
import logging

import pytest

from common import jsonlog, request_id


@pytest.mark.parametrize('raw, kept', [
    ('9f1c0d2e-1b2a-4c3d-8e9f-0a1b2c3d4e5f', True),  # nginx's $request_id style, or a UUID
    ('req.abc:1/2+3=4@x_y', True),
    ('x' * 100, True),                             # the longest kept
    ('x' * 101, False),                            # too long: a new one is made
    ('', False),
    ('two words', False),                          # no spaces
    ('line\nbreak', False),                        # nothing that breaks a log line or a header
    ('-starts-with-dash', False),
    ('é', False),
    (None, False),
])
def test_a_request_id_is_kept_only_when_it_is_a_short_plain_token(raw, kept):
    assert (request_id.clean(raw) is not None) is kept
    made = request_id.from_header(raw)
    assert made == raw if kept else len(made) == 32 and made != raw


def record(message='hello %s', args=('world',), **extra):
    logger = logging.getLogger('heavy_lanes.test')
    made = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, args, None, extra=extra)
    jsonlog.ContextFilter().filter(made)
    return json.loads(jsonlog.JsonFormatter().format(made))


def test_a_log_line_is_one_json_object_with_the_bound_request_id():
    with request_id.bound('req-42'):
        line = record()
    assert line['message'] == 'hello world' and line['level'] == 'WARNING'
    assert line['logger'] == 'heavy_lanes.test' and line['request_id'] == 'req-42'
    assert line['time'].endswith('Z') and isinstance(line['process'], int)
    assert 'request_id' not in record()  # nothing bound: no field, not null
    assert record(status=503)['status'] == 503  # extra fields are kept
