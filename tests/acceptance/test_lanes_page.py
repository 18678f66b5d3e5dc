"""The staff lanes page in a real headless browser, against a live server, the real Redis and a real lane
worker: a staff user logs in through the admin's login page, sees the lanes, queues, pools and decisions,
sets es2_knn and sees the pool follow, pauses and resumes the lane; a user who isn't staff is refused.

Set HEAVY_LANES_DASHBOARD_SCREENSHOT to a path to keep the page's screenshot there (docs/img/lanes-page.png
is one); every run keeps one in its own tmp_path.
"""
import os
import uuid

import pytest
import requests
from django.test import Client
from rest_framework.test import APIClient
from selenium.webdriver.common.by import By

from capacity.models import CapacityConfig
from tests.acceptance.browser import wait_for

DASHBOARD = '/capacity/dashboard/'
REFRESH_WAIT = 20  # a few of the page's refreshes (3 s) and the workers' reconcile interval (0.5 s here)


def text(browser, selector):
    return browser.find_element(By.CSS_SELECTOR, selector).text.strip()


def log_in(browser, live_server, username):
    """Open the lanes page, follow its login link and log in on the admin's login page."""
    browser.get(live_server.url + DASHBOARD)
    assert text(browser, 'h1') == 'Staff only'
    browser.find_element(By.LINK_TEXT, 'Log in with a staff account').click()
    wait_for(lambda: browser.find_elements(By.NAME, 'username'), message='the login form')
    browser.find_element(By.NAME, 'username').send_keys(username)
    browser.find_element(By.NAME, 'password').send_keys('pw')  # make_user's password
    browser.find_element(By.CSS_SELECTOR, 'form input[type=submit]').click()


def submit(client, source):
    """A bulk semantic $match (es2_knn) that answers a handle at once; its rows are new each time, so each
    call runs work of its own."""
    rows = [{'name': f'high blood pressure {uuid.uuid4().hex[:6]}'}, {'name': 'sugar diabetes'}]
    response = client.post('/concepts/$match/?semantic=true', {'rows': rows, 'target_repo_url': source},
                           format='json', HTTP_PREFER='respond-async')
    assert response.status_code == 202, response.content
    return response.json()['id']


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.redis
def test_staff_see_the_lanes_set_es2_knn_see_the_pool_follow_pause_and_resume(
        browser, live_server, start_worker, tiny_source, make_user, tmp_path):
    make_user(username='grace', is_staff=True)
    core = APIClient()
    core.credentials(HTTP_AUTHORIZATION=f'Token {make_user("core_user").auth_token.key}')
    # Queued before any worker runs one, so each holds its leases: es2_knn's bulk limit is 2, so two calls
    # are admitted and two shadow-refused (they find the lane full, and queue all the same).
    calls = [submit(core, tiny_source) for _ in range(4)]
    worker = start_worker(name='knn', queues=('es2_knn',), concurrency=2)

    log_in(browser, live_server, 'grace')
    wait_for(lambda: browser.current_url == live_server.url + DASHBOARD, message='the lanes page after login')
    # The lanes, with their limits from the config in force (the defaults).
    wait_for(lambda: text(browser, 'tr[data-lane="es2_knn"] td.limit') == '3 (bulk 2)', message='the lanes')
    rows = browser.find_elements(By.CSS_SELECTOR, '#lanes tbody tr')
    lanes = [row.get_attribute('data-lane') for row in rows]
    assert lanes == ['api_heavy', 'es2_knn', 'tier:staff', 'tier:core', 'tier:early_access', 'tier:preview',
                     'api_heavy_task']
    assert text(browser, 'tr[data-lane="api_heavy"] td.limit') == '4 (bulk 3)'
    assert text(browser, '#mode') == 'shadow'
    # The calls ran (the worker's node pool of 2) and were counted this minute.
    wait_for(lambda: all(core.get(f'/tasks/{call_id}/').json()['state'] == 'succeeded' for call_id in calls),
             timeout=60, interval=0.2, message='the calls to succeed')
    wait_for(lambda: text(browser, '#legend li[data-decision="admitted"]') == 'admitted 2'
             and text(browser, '#legend li[data-decision="shadow-refused"]') == 'shadow-refused 2',
             timeout=REFRESH_WAIT, message='the decisions in the chart')
    # The source's indexes: the semantic one the calls needed is ready.
    semantic = f'tr.index[data-source="{tiny_source}"][data-index="semantic"]'
    wait_for(lambda: text(browser, f'{semantic} td.state') == 'ready', timeout=REFRESH_WAIT,
             message='the semantic index, ready')
    node = f'tr[data-node="{worker.node}"]'
    wait_for(lambda: text(browser, f'{node} td.pool') == '2' and text(browser, f'{node} td.share') == '2',
             timeout=REFRESH_WAIT, message='the es2_knn node and its pool of 2')
    assert text(browser, 'tr.queue[data-queue="es2_knn"] td.configured') == '2 = es2_knn - reserve_single_row'

    # Set es2_knn to 4 with a note: one config version, by grace, and the pool follows to 4 - 1 = 3.
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-lane="es2_knn"]')
    row.find_element(By.CSS_SELECTOR, 'input.limit-input').send_keys('4')
    row.find_element(By.CSS_SELECTOR, 'input.note-input').send_keys('more kNN for the bulk run')
    row.find_element(By.CSS_SELECTOR, 'button.set').click()
    wait_for(lambda: 'es2_knn 3 → 4' in text(browser, '#message'), message='the change to be saved')
    latest = CapacityConfig.get_latest()
    assert (latest.config['es2_knn'], latest.created_by.username, latest.note) == (
        4, 'grace', 'more kNN for the bulk run')
    wait_for(lambda: text(browser, f'{node} td.pool') == '3'
             and text(browser, 'tr.queue[data-queue="es2_knn"] td.pool') == '3',
             timeout=REFRESH_WAIT, message='the pool to follow to 3')
    assert text(browser, 'tr[data-lane="es2_knn"] td.limit') == '4 (bulk 3)'
    newest = '#history tbody tr:first-child'
    wait_for(lambda: text(browser, f'{newest} td.who') == 'grace', message='the change in the history')
    assert text(browser, f'{newest} td.changes') == 'es2_knn 3 → 4'
    assert text(browser, f'{newest} td.note') == 'more kNN for the bulk run'
    save_screenshot(browser, tmp_path)

    # Pause: the limit goes to 0 and the node stops consuming; resume puts back the 4 the pause took away.
    row.find_element(By.CSS_SELECTOR, 'button.pause').click()
    wait_for(lambda: text(browser, 'tr[data-lane="es2_knn"] td.limit') == '0 (paused)', message='the pause')
    assert text(browser, 'tr[data-lane="es2_knn"] button.pause') == 'Resume'
    wait_for(lambda: text(browser, f'{node} td.consuming') == 'not consuming', timeout=REFRESH_WAIT,
             message='the node to stop consuming the paused queue')
    row.find_element(By.CSS_SELECTOR, 'button.pause').click()
    wait_for(lambda: text(browser, 'tr[data-lane="es2_knn"] td.limit') == '4 (bulk 3)', message='the resume')
    wait_for(lambda: text(browser, f'{node} td.consuming') == 'consuming'
             and text(browser, f'{node} td.pool') == '3',
             timeout=REFRESH_WAIT, message='the node to consume again')
    assert [(row.created_by.username, row.note, row.config['es2_knn'])
            for row in CapacityConfig.objects.order_by('id')] == [
        ('grace', 'more kNN for the bulk run', 4), ('grace', 'paused es2_knn from the lanes page', 0),
        ('grace', 'resumed es2_knn from the lanes page', 4)]

    # api_heavy can't go to 0 while the single-row reserve is above it: its pause takes both, with the note.
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-lane="api_heavy"]')
    row.find_element(By.CSS_SELECTOR, 'input.note-input').send_keys('backend maintenance')
    row.find_element(By.CSS_SELECTOR, 'button.pause').click()
    wait_for(lambda: text(browser, 'tr[data-lane="api_heavy"] td.limit') == '0 (paused)', message='the pause')
    paused = CapacityConfig.get_latest()
    assert (paused.config['api_heavy']['cluster'], paused.config['reserve_single_row'], paused.note) == (
        0, 0, 'backend maintenance')
    row.find_element(By.CSS_SELECTOR, 'button.pause').click()
    wait_for(lambda: text(browser, 'tr[data-lane="api_heavy"] td.limit') == '4 (bulk 3)',
             message='the resume')
    resumed = CapacityConfig.get_latest().config
    assert (resumed['api_heavy']['cluster'], resumed['reserve_single_row'], resumed['es2_knn']) == (4, 1, 4)


def save_screenshot(browser, tmp_path):
    """The whole page as it is now, in this test's tmp_path and, when asked, where
    HEAVY_LANES_DASHBOARD_SCREENSHOT says."""
    height = browser.execute_script('return document.documentElement.scrollHeight')
    browser.set_window_size(browser.get_window_size()['width'], height + 200)
    browser.save_screenshot(str(tmp_path / 'lanes-page.png'))
    wanted = os.environ.get('HEAVY_LANES_DASHBOARD_SCREENSHOT')
    if wanted:
        browser.save_screenshot(wanted)


@pytest.mark.browser
@pytest.mark.slow
def test_a_user_who_is_not_staff_is_refused_the_lanes_page_and_its_endpoints(browser, live_server, make_user):
    make_user(username='lin')
    log_in(browser, live_server, 'lin')
    wait_for(lambda: 'staff account' in text(browser, '.errornote'), message="the login form's refusal")
    browser.get(live_server.url + DASHBOARD)
    assert text(browser, 'h1') == 'Staff only'

    # Logged in another way (a session of Django's own), the page and the endpoints its script calls say 403.
    django = Client()
    assert django.login(username='lin', password='pw')
    session = django.cookies['sessionid'].value
    browser.add_cookie({'name': 'sessionid', 'value': session, 'path': '/'})
    browser.get(live_server.url + DASHBOARD)
    assert text(browser, 'h1') == 'Staff only'
    assert 'You do not have permission' in text(browser, 'body')
    cookies = {'sessionid': session}
    for path in (DASHBOARD, '/capacity/status/', '/capacity/config/', '/capacity/config/history/',
                 '/capacity/decisions/'):
        assert requests.get(live_server.url + path, cookies=cookies, timeout=10).status_code == 403, path
    assert CapacityConfig.objects.count() == 0


@pytest.mark.browser
def test_the_interactive_api_page_shows_the_heavy_calls_from_local_files(browser, live_server):
    browser.get(live_server.url + '/schema/docs/')
    paths = wait_for(lambda: [element.text for element in browser.find_elements(
        By.CSS_SELECTOR, '.opblock-summary-path')], message="Swagger UI's operations")
    # Swagger UI breaks long paths with zero-width spaces.
    shown = {path.replace('\u200b', '').strip() for path in paths}
    assert {'/concepts/$match/', '/concepts/$rerank/', '/tasks/{call_id}/', '/capacity/decisions/'} <= shown


def test_the_admin_login_page_answers_at_its_url(live_server):
    response = requests.get(live_server.url + '/admin/login/', timeout=10)
    assert response.status_code == 200
    assert 'name="username"' in response.text and 'name="password"' in response.text
    index = requests.get(live_server.url + '/admin/', timeout=10, allow_redirects=False)
    assert (index.status_code, index.headers['Location']) == (302, '/admin/login/?next=/admin/')
