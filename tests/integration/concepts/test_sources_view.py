import pytest
from django.urls import reverse
from rest_framework.test import APIClient


def client_for(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f'Token {user.auth_token.key}')
    return client


@pytest.mark.django_db
def test_sources_lists_each_loaded_source_with_its_url_version_and_concept_count(tiny_source, make_user):
    from concepts.loader import load_terminology
    from concepts.terminology import read_tiny
    tiny = read_tiny()
    load_terminology(type(tiny)('OTHER', 'Small', 'Small one', '2024-01', '', tiny.concepts[:3]))

    response = client_for(make_user()).get(reverse('sources'))
    assert response.status_code == 200
    assert response.json() == [
        {'url': '/orgs/HL/sources/TinyClinical/', 'org': 'HL', 'mnemonic': 'TinyClinical',
         'name': 'Tiny clinical terminology', 'version': '1', 'concept_count': 40},
        {'url': '/orgs/OTHER/sources/Small/', 'org': 'OTHER', 'mnemonic': 'Small', 'name': 'Small one',
         'version': '2024-01', 'concept_count': 3},
    ]


@pytest.mark.django_db
def test_sources_is_empty_before_anything_is_loaded(make_user):
    assert client_for(make_user()).get('/sources/').json() == []


@pytest.mark.django_db
def test_sources_needs_a_token():
    response = APIClient().get('/sources/')
    assert response.status_code == 401
    assert response['WWW-Authenticate'] == 'Token'
