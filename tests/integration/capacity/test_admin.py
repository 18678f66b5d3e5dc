"""Django's admin at /admin/: the capacity config history there for every staff user, read-only (changes go
through the config endpoint, which records them), and tokens that are refused as soon as the admin deletes
them."""
import pytest
from django.test import Client
from rest_framework.test import APIClient

from capacity.config import save_config
from capacity.models import CapacityConfig
from workers import local_cache, notify

pytestmark = pytest.mark.django_db


def session_client(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_the_admin_is_at_admin_and_asks_for_a_login():
    login = Client().get('/admin/login/')
    assert login.status_code == 200 and b'name="password"' in login.content
    assert Client().get('/admin/')['Location'] == '/admin/login/?next=/admin/'


def test_staff_read_the_config_history_in_the_admin_but_change_it_nowhere(make_user):
    author = make_user(username='ops-bob', is_staff=True)
    save_config({'es2_knn': 6}, user=author, note='Tuesday bulk run')
    row = CapacityConfig.get_latest()
    staff = session_client(make_user(is_staff=True))  # staff, no model permissions, not a superuser

    listing = staff.get('/admin/capacity/capacityconfig/')
    assert listing.status_code == 200
    assert b'Tuesday bulk run' in listing.content and b'ops-bob' in listing.content
    assert '<code>es2_knn</code>: 3 → 6'.encode() in listing.content
    detail = staff.get(f'/admin/capacity/capacityconfig/{row.pk}/change/')
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert staff.get('/admin/capacity/capacityconfig/add/').status_code == 403
    assert staff.get(f'/admin/capacity/capacityconfig/{row.pk}/delete/').status_code == 403
    edited = staff.post(f'/admin/capacity/capacityconfig/{row.pk}/change/',
                        {'note': 'rewritten', 'csrfmiddlewaretoken': staff.cookies['csrftoken'].value})
    assert edited.status_code == 403
    assert CapacityConfig.objects.get().note == 'Tuesday bulk run'
    # Tokens are there for superusers (their keys are secrets): plain staff aren't shown them.
    assert staff.get('/admin/authtoken/tokenproxy/').status_code == 403


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_token_deleted_in_the_admin_is_refused_at_once(make_user):
    """docs/operations.md tells operators to revoke a token in the admin: the API processes, which keep a
    token they have seen for HEAVY_LANES_LOCAL_CACHE_SECONDS, must drop it as soon as the admin deletes it."""
    hub = notify.get_hub()
    hub.start()
    assert hub.connected.wait(5)  # tokens are kept only while the hub that announces their changes listens
    user = make_user()
    admin = session_client(make_user(is_staff=True, is_superuser=True))  # a saved user drops every kept token
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f'Token {user.auth_token.key}')
    assert api.get('/sources/').status_code == 200
    assert (local_cache.TOKEN, user.auth_token.key) in local_cache._kept.get().entries

    page = admin.get(f'/admin/authtoken/tokenproxy/{user.pk}/delete/')
    assert page.status_code == 200
    deleted = admin.post(f'/admin/authtoken/tokenproxy/{user.pk}/delete/',
                         {'post': 'yes', 'csrfmiddlewaretoken': admin.cookies['csrftoken'].value})
    assert deleted.status_code == 302
    assert api.get('/sources/').status_code == 401
