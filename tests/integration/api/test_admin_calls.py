"""Calls and their work in Django's admin at /admin/: every staff user reads them, nobody edits them, and the
one change offered (cancel) goes through the same cancel as DELETE /tasks/<id>/."""
import pytest
from django.test import Client

from tests.integration.workers.test_queue import holds, submit
from workers.models import Call, Work

pytestmark = pytest.mark.redis


def session_client(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_the_admin_asks_for_a_login_at_its_url(db):
    login = Client().get('/admin/login/')
    assert login.status_code == 200 and b'name="password"' in login.content
    assert Client().get('/admin/workers/call/')['Location'] == '/admin/login/?next=/admin/workers/call/'


def test_staff_read_calls_and_work_in_the_admin_and_cancel_a_call_as_its_owner_would(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(es2_knn=1)  # paused: the call waits in its queue
    owner = make_user(username='mapper-ann')
    call_id = submit(api_as(owner), tiny_source, headers={
        'HTTP_X_OCL_EVENT_METADATA': '{"automatch_run_id": "run-7"}'}).json()['id']
    assert holds(lanes_redis, call_id) > 0
    staff = session_client(make_user(is_staff=True))  # staff, no model permissions, not a superuser

    calls = staff.get('/admin/workers/call/?q=run-7')
    assert calls.status_code == 200
    assert call_id.encode() in calls.content and b'mapper-ann' in calls.content and b'queued' in calls.content
    detail = staff.get(f'/admin/workers/call/{call_id}/change/')
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    works = staff.get('/admin/workers/work/?state__exact=queued')
    assert works.status_code == 200 and call_id.encode() in works.content
    assert staff.get('/admin/workers/call/add/').status_code == 403
    assert staff.get(f'/admin/workers/work/{call_id}/delete/').status_code == 403
    assert session_client(make_user()).get('/admin/workers/call/').status_code == 302  # not staff: the login

    done = staff.post('/admin/workers/call/', {'action': 'cancel_calls', '_selected_action': [call_id],
                                               'csrfmiddlewaretoken': staff.cookies['csrftoken'].value})
    assert done.status_code == 302
    assert Call.objects.get(pk=call_id).cancelled_at is not None
    assert Work.objects.get(pk=call_id).state == 'cancelled' and holds(lanes_redis, call_id) == 0
