"""The error handler's mapping of exceptions no view turns into an answer itself."""
from django.db import DataError, OperationalError

from api import errors


def test_a_value_the_database_cant_store_is_the_requests_400_not_an_outage():
    response = errors.handle(DataError('value too long for type character varying(100)\nDETAIL: x'), {})
    assert response.status_code == 400 and 'Retry-After' not in response
    assert response.data == {'detail': 'A value in the request can not be stored: value too long for type '
                                       'character varying(100)', 'error_code': 'invalid'}


def test_a_database_that_cant_write_is_a_503_naming_the_database():
    response = errors.handle(OperationalError('cannot execute INSERT in a read-only transaction'), {})
    assert response.status_code == 503 and response['Retry-After'] == '5'
    assert response.data['error_code'] == 'database_unavailable'
