"""Property-based fuzzing of the HTTP API: no input, however odd, gets a 5xx. Runs in process against the
WSGI app with the real Redis lanes and broker, on SQLite and on PostgreSQL (`each_database`).

- From the API's own OpenAPI schema (schemathesis), as a staff user (so every operation is reachable) and
  as an ordinary one.
- Bodies no database or renderer can take, which a schema can't generate: valid `$match` (semantic,
  reranked, lexical) and `$rerank` bodies with one number out of float range (`1e400`), one NUL or one
  unpaired surrogate put in a random place, in a value or a key (hypothesis). Each is a 400 naming where
  it is. The same hazards in `X-OCL-Event-Metadata` are ignored, as documented: the call goes ahead.
"""
import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance, not_a_server_error, response_headers_conformance, response_schema_conformance,
)

from api.wsgi import application
from capacity.admission import log_record
from workers.lifecycle import admission_of
from workers.models import Call

pytestmark = pytest.mark.redis
# /readyz answers 503 by design while a service is down or a lane has no consumer (none runs here); its own
# tests (test_readiness.py) cover it.
schema = schemathesis.openapi.from_wsgi('/schema/', application).exclude(path='/readyz')
EXAMPLES = 30
# No 5xx, and every answer with a documented status is what the schema says (its body, content type and
# headers), so a client generated from the schema accepts it. (Statuses every endpoint may answer and the
# schema leaves out, 401, 403, 404, 405, 415, are errors to such a client, as they should be.)
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance, response_headers_conformance]
HAZARD_EXAMPLES = 40
FUZZ = settings(max_examples=HAZARD_EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture
def tokens(make_user, tiny_source, broker, lanes_redis, configure):
    # No lane worker runs here: a valid heavy call that waited for its result would wait for nothing, so
    # waiting is cut to a second (a waited call then answers 202).
    configure(wait={'default_seconds': 1, 'max_seconds': 1})
    return {'staff': make_user(is_staff=True).auth_token.key, 'user': make_user().auth_token.key}


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.parametrize('who', ['staff', 'user'])
def test_no_input_gets_a_server_error(case, who, tokens, each_database):
    response = case.call(headers={'Authorization': f'Token {tokens[who]}'})
    case.validate_response(response, checks=CHECKS)


def conforming(path, method, token, **parts):
    """The answer to the call of the schema's `path` and `method` made of `parts` (body, query, headers),
    held to the schema as the fuzzing above holds generated calls."""
    case = schema[path][method].Case(**parts)
    response = case.call(headers={'Authorization': f'Token {token}'})
    case.validate_response(response, checks=CHECKS)
    return response


def test_a_refusal_of_either_kind_is_an_answer_the_schema_describes(tokens, configure, monkeypatch, each_database):
    from api.throttles import HeavyRateThrottle
    configure(mode='enforce', enforce_for='all', es2_knn=1)  # es2_knn paused: every semantic call is refused
    body = {'rows': [{'name': 'fever'}, {'name': 'cough'}], 'target_repo_url': SOURCE}  # bulk: no reserve
    refused = conforming('/concepts/$match/', 'POST', tokens['user'], body=body, query={'semantic': 'true'})
    assert refused.status_code == 429 and refused.json()['error_code'] == 'capacity_exceeded'
    assert refused.json()['paused'] is True

    monkeypatch.setitem(HeavyRateThrottle.THROTTLE_RATES, 'heavy', '1/min')
    answers = [conforming('/concepts/$match/', 'POST', tokens['user'], body=body) for _ in range(2)]
    assert [answer.status_code for answer in answers] == [200, 429]
    assert answers[1].json()['error_code'] == 'rate_limited'  # no `scope`, no `paused`


@pytest.mark.parametrize('endpoint', ['/concepts/$match/', '/concepts/$rerank/'])
def test_a_heavy_call_takes_json_only_as_its_schema_says(endpoint, caller, each_database):
    body = schema[endpoint]['POST'].definition.raw['requestBody']['content']
    assert list(body) == ['application/json']
    form = caller.post(endpoint, {'q': 'fever', 'target_repo_url': SOURCE}, format='multipart')
    assert form.status_code == 415 and form.json()['error_code'] == 'unsupported_media_type'


# --- hazards a schema can't generate

PLACEHOLDER = '\x01hazard\x01'  # stands where the hazard goes; json.dumps writes it as "\u0001hazard\u0001"
HAZARDS = {'1e400': 'number', '-1E+999': 'number', '"\\u0000"': 'text', '"fever\\u0000"': 'text',
           '"\\ud800"': 'text', '"a\\udfffb"': 'text'}
KEY_HAZARDS = ['\\u0000', 'k\\u0000', '\\ud83d', 'x\\udc00']
# Text and keys of the generated bodies: printable, no NUL or surrogate of their own, no placeholder.
TEXT = st.text(st.characters(blacklist_categories=('Cs', 'Cc')), min_size=1, max_size=12)
KEYS = st.text(st.characters(whitelist_categories=('Ll', 'Lu', 'Nd')), min_size=1, max_size=8)
SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(-1e9, 1e9) | TEXT
EXTRA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
                     max_leaves=6)
ROW = st.fixed_dictionaries({'name': TEXT.filter(str.strip)}, optional={'id': SCALARS, 'extra': EXTRA})
SOURCE = '/orgs/HL/sources/TinyClinical/'
MATCH = st.fixed_dictionaries({'rows': st.lists(ROW, min_size=1, max_size=3), 'target_repo_url': st.just(SOURCE)},
                              optional={'map_config': st.lists(st.dictionaries(KEYS, SCALARS, max_size=2), max_size=2),
                                        'filter': st.dictionaries(KEYS, SCALARS, max_size=2)})
RERANK_ROW = st.fixed_dictionaries({'display_name': TEXT}, optional={'search_meta': st.dictionaries(KEYS, SCALARS),
                                                                     'extra': EXTRA})
RERANK = st.fixed_dictionaries({'q': TEXT.filter(str.strip), 'rows': st.lists(RERANK_ROW, min_size=1, max_size=3)})


def places(value, path=''):
    """(path, container, key) of every value in `value`, as the parser names paths (`rows[0].name`)."""
    if isinstance(value, dict):
        for key, item in value.items():
            child = f'{path}.{key}' if path else key
            yield child, value, key
            yield from places(item, child)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            child = f'{path}[{index}]'
            yield child, value, index
            yield from places(item, child)


@st.composite
def with_a_hazard(draw, bodies):
    """(JSON text of a body from `bodies` with one hazard in it, the path the answer must name)."""
    body = draw(bodies)
    if draw(st.booleans()):  # in a value
        path, container, key = draw(st.sampled_from(list(places(body))))
        container[key] = PLACEHOLDER
        text = json.dumps(body).replace(json.dumps(PLACEHOLDER), draw(st.sampled_from(sorted(HAZARDS))))
        return text, path
    objects = [('body', body)] + [(path, container[key]) for path, container, key in places(body)
                                  if isinstance(container[key], dict)]
    path, target = draw(st.sampled_from(objects))
    target[PLACEHOLDER] = draw(SCALARS)
    hazard = draw(st.sampled_from(KEY_HAZARDS))
    return json.dumps(body).replace(json.dumps(PLACEHOLDER)[1:-1], hazard), path


@pytest.fixture
def caller(make_user, tiny_source, lanes_redis, broker, api_as):
    return api_as(make_user())


def hazard_answer(client, path, text, **headers):
    return client.generic('POST', path, text.encode('utf-8'), content_type='application/json',
                          HTTP_PREFER='respond-async', **headers)


@pytest.mark.parametrize('endpoint', ['/concepts/$match/?semantic=true', '/concepts/$match/?reranker=true',
                                      '/concepts/$match/', '/concepts/$rerank/'])
def test_a_body_with_a_value_no_database_takes_is_a_400_naming_where_it_is(endpoint, caller, each_database):
    bodies = RERANK if endpoint.startswith('/concepts/$rerank') else MATCH

    @FUZZ
    @given(with_a_hazard(bodies))
    def check(hazard):
        text, where = hazard
        response = hazard_answer(caller, endpoint, text)
        assert response.status_code == 400, (text, response.status_code, response.content[:300])
        assert response.json()['error_code'] == 'invalid' and where in response.json()['detail'], (text, where)
    check()
    assert not Call.objects.exists()


METADATA = st.fixed_dictionaries({'capacity_aware': st.sampled_from(['true', 'false', True, 1])},
                                 optional={'algorithm_id': TEXT, 'automatch_run_id': TEXT, 'other': EXTRA})


def test_metadata_with_a_value_no_database_takes_is_ignored(caller, each_database):
    body = json.dumps({'rows': [{'name': 'fever'}], 'target_repo_url': SOURCE})
    seen = []

    @FUZZ
    @given(with_a_hazard(METADATA), st.integers(0, 10**9))
    def check(hazard, salt):
        metadata, _ = hazard
        response = hazard_answer(caller, '/concepts/$match/?semantic=true',
                                 body.replace('fever', f'fever {salt}'), HTTP_X_OCL_EVENT_METADATA=metadata)
        assert response.status_code == 202, (metadata, response.status_code, response.content[:300])
        seen.append(response.json()['id'])
    check()
    # Every call was written, with what of its header can be stored.
    calls = list(Call.objects.filter(pk__in=seen))
    assert len(calls) == len(seen)
    for call in calls:
        record = log_record(admission_of(call))
        for name in ('algorithm_id', 'automatch_run_id'):
            value = record.get(name)
            assert value is None or ('\x00' not in value and value.encode('utf-8')), (name, value)
