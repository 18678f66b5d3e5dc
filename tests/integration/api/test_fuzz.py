"""Property-based fuzzing of the HTTP API from its own OpenAPI schema (schemathesis): no input, however
odd, gets a 5xx. Runs in process against the WSGI app, as a staff user (so every operation is reachable)
and as an ordinary one, with the real Redis lanes and broker."""
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from api.wsgi import application

pytestmark = pytest.mark.redis
# /readyz answers 503 by design while a service is down or a lane has no consumer (none runs here); its own
# tests (test_readiness.py) cover it.
schema = schemathesis.openapi.from_wsgi('/schema/', application).exclude(path='/readyz')
EXAMPLES = 30


@pytest.fixture
def tokens(make_user, tiny_source, broker, lanes_redis, configure):
    # No lane worker runs here: a valid heavy call that waited for its result would wait for nothing, so
    # waiting is cut to a second (a waited call then answers 202).
    configure(wait={'default_seconds': 1, 'max_seconds': 1})
    return {'staff': make_user(is_staff=True).auth_token.key, 'user': make_user().auth_token.key}


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.parametrize('who', ['staff', 'user'])
def test_no_input_gets_a_server_error(case, who, tokens):
    response = case.call(headers={'Authorization': f'Token {tokens[who]}'})
    case.validate_response(response, checks=[not_a_server_error])
