"""Bad `$match` / `$rerank` bodies and query parameters are refused with a message naming the field."""
import pytest
from rest_framework.exceptions import ValidationError

from concepts.services import (
    MAX_LIMIT,
    MAX_ROWS,
    MAX_TEXT_CHARS,
    MAX_WINDOW,
    validate_match,
    validate_payload,
    validate_rerank_body,
)

URL = '/orgs/HL/sources/TinyClinical/'


def errors_of(validate, *args):
    with pytest.raises(ValidationError) as caught:
        validate(*args)
    return {field: [str(message) for message in messages] for field, messages in caught.value.detail.items()}


def match_errors(body, query=None):
    return errors_of(validate_match, body, query or {})


def rerank_errors(body):
    return errors_of(validate_rerank_body, body)


@pytest.fixture
def body(tiny_source):
    return {'rows': [{'name': 'fever', 'id': 7}], 'target_repo_url': URL}


def test_a_good_match_body_is_cleaned_with_ocls_default_limit(body):
    assert validate_match(body, {}) == {
        'body': {'rows': [{'name': 'fever', 'id': 7}], 'target_repo_url': URL, 'map_config': [], 'filter': {}},
        'params': {'limit': 1, 'start': 0, 'best_match': False, 'verbose': False}}


def test_a_cleaned_payload_validates_to_itself(body):
    payload = validate_match({**body, 'target_repo_url': 'orgs/HL/sources/TinyClinical'},
                             {'limit': '3', 'page': '2', 'bestMatch': 'true', 'verbose': 'True'})
    assert payload['body']['target_repo_url'] == URL
    assert payload['params'] == {'limit': 3, 'start': 3, 'best_match': True, 'verbose': True}
    assert validate_payload(payload)[0] == payload


@pytest.mark.parametrize('rows', [None, [], 'fever', {'name': 'fever'}])
def test_missing_or_empty_rows_are_refused_on_rows(body, rows):
    body['rows'] = rows
    if rows is None:
        del body['rows']
    assert match_errors(body) == {'rows': ['Invalid or missing "rows" in request body.']}


@pytest.mark.parametrize('row', [{}, {'name': ''}, {'name': '   '}, {'name': 3}, {'code': 'x'}])
def test_a_row_without_a_non_empty_name_is_refused_with_its_position(body, row):
    body['rows'] = [{'name': 'ok'}, row]
    assert match_errors(body) == {
        'rows': ['Row 1: each row must be an object with a non-empty "name" string.']}


def test_a_row_that_is_not_an_object_is_refused_with_its_position(body):
    body['rows'] = [{'name': 'ok'}, 'fever']
    assert match_errors(body) == {'rows': ['Row 1: each row must be an object.']}


def test_too_many_rows_are_refused_with_the_limit(body):
    body['rows'] = [{'name': 'x'}] * (MAX_ROWS + 1)
    message = f'At most {MAX_ROWS} rows per request, got {MAX_ROWS + 1}.'
    assert match_errors(body) == {'rows': [message]}


def test_a_row_text_over_the_limit_is_refused(body):
    body['rows'] = [{'name': 'x' * (MAX_TEXT_CHARS + 1)}]
    message = f'Row 0: "name" is longer than {MAX_TEXT_CHARS} characters.'
    assert match_errors(body) == {'rows': [message]}


def test_the_largest_allowed_body_is_accepted(body):
    body['rows'] = [{'name': 'x' * MAX_TEXT_CHARS}] * MAX_ROWS
    assert len(validate_match(body, {})['body']['rows']) == MAX_ROWS


def test_a_missing_target_repo_url_is_refused_on_that_field(body):
    del body['target_repo_url']
    assert match_errors(body) == {
        'target_repo_url': ['Missing "target_repo_url" (or "target_repo") in request body.']}


@pytest.mark.parametrize('url', ['/orgs/HL/sources/Nope/', URL + '2/', 'http://x', 42])
def test_an_unknown_source_is_refused_on_target_repo_url(body, url):
    body['target_repo_url'] = url
    errors = match_errors(body)
    assert list(errors) == ['target_repo_url']
    assert errors['target_repo_url'][0].startswith(f'Unknown source {url!r}')


def test_the_current_version_url_of_a_source_is_accepted(body):
    body['target_repo_url'] = URL + '1/'
    assert validate_match(body, {})['body']['target_repo_url'] == URL


@pytest.mark.parametrize('limit', ['0', str(MAX_LIMIT + 1), '-1', '2.5', 'five', '²'])
def test_a_query_limit_outside_one_to_a_hundred_is_refused_on_limit(body, limit):
    assert match_errors(body, {'limit': limit}) == {'limit': [f'"limit" must be an integer from 1 to {MAX_LIMIT}.']}


@pytest.mark.parametrize('limit', [0, MAX_LIMIT + 1, 2.5, True, 'five'])
def test_a_body_limit_outside_one_to_a_hundred_is_refused_on_limit(body, limit):
    body['limit'] = limit
    assert match_errors(body) == {'limit': [f'"limit" must be an integer from 1 to {MAX_LIMIT}.']}


def test_offset_and_page_must_be_whole_and_stay_within_the_window(body):
    assert list(match_errors(body, {'offset': '-1'})) == ['offset']
    assert list(match_errors(body, {'page': '0'})) == ['page']
    assert match_errors(body, {'limit': '100', 'page': '11'}) == {
        'offset': [f'offset (or page) and limit reach past candidate {MAX_WINDOW}.']}
    assert validate_match(body, {'limit': '100', 'page': '10'})['params']['start'] == 900


def test_map_config_and_filter_must_have_ocls_types(body):
    assert match_errors({**body, 'map_config': {}, 'filter': []}) == {
        'map_config': ['"map_config" must be a list.'], 'filter': ['"filter" must be an object.']}


def test_every_bad_field_is_reported_at_once(tiny_source):
    errors = match_errors({'rows': [], 'filter': 1})
    assert set(errors) == {'rows', 'target_repo_url', 'filter'}


def test_a_body_that_is_not_an_object_is_refused():
    assert match_errors([1]) == {'non_field_errors': ['Request body must be a JSON object.']}
    assert rerank_errors('q') == {'non_field_errors': ['Request body must be a JSON object.']}


def test_a_rerank_body_without_q_is_refused_on_q():
    assert rerank_errors({'rows': [{'name': 'a'}]}) == {'q': ['Missing "q" in request body.']}


@pytest.mark.parametrize('q', ['', '  ', 5])
def test_a_blank_or_non_text_q_is_refused_on_q(q):
    assert rerank_errors({'q': q, 'rows': [{'name': 'a'}]}) == {
        'q': ['"q" must be a non-empty string.']}


def test_a_rerank_body_with_empty_rows_is_refused_on_rows():
    assert rerank_errors({'q': 'fever', 'rows': []}) == {
        'rows': ['Invalid or missing "rows" in request body.']}


def test_rerank_rows_must_be_objects_and_keys_field_names():
    assert rerank_errors({'q': 'fever', 'rows': [1]}) == {'rows': ['Row 0: each row must be an object.']}
    errors = rerank_errors({'q': 'fever', 'rows': [{}], 'score_key': 'search_meta.x', 'name_key': 3})
    assert set(errors) == {'score_key', 'name_key'}


def test_only_the_shipped_reranker_may_be_asked_for():
    errors = rerank_errors({'q': 'fever', 'rows': [{}], 'encoder_model': 'BAAI/bge-reranker-v2-m3'})
    assert errors == {'encoder_model': ["Only the reranker 'semantic' is available here."]}


def test_a_good_rerank_body_is_returned_with_ocls_default_keys():
    body = {'q': 'fever', 'rows': [{'display_name': 'Pyrexia', 'code': 'X'}]}
    assert validate_rerank_body(body) == {**body, 'name_key': 'display_name', 'score_key': 'search_rerank_score'}
