"""The pages a person opens under `make run`, in a real headless browser against the service `make run` itself
starts (`python -m devstack`: gunicorn with the service's own settings, DEBUG off), not a test server: the
lanes page draws its rows and its buttons act, the admin is styled, /schema/docs/ draws Swagger UI.

Each of them needs the static files the API serves itself (WhiteNoise, from what collectstatic gathered:
hashed names, gzip copies). pytest-django's live server, which tests/acceptance/test_lanes_page.py uses, serves
static files on its own, so it couldn't see them missing: the lanes page stayed at "Updated never" with no rows
under `make run` while that test passed.

One stack for the module (a first start: migrate, load HPO, collectstatic, the model-free index), used as soon
as its API answers (the pages need no lane worker; those start once the index is built), stopped by Ctrl-C at
the end; every process group it reported is killed at teardown, pass or fail.
"""
import json
import re
import subprocess
import sys
import time

import pytest
import requests
from selenium.webdriver.common.by import By

from devstack.processes import http_get
from tests.acceptance.browser import wait_for
from tests.integration.devstack.test_launcher import ROOT, Launch

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(150)]

START_SECONDS = 60  # to the API's first answer on a first start: the database steps, then gunicorn
DASHBOARD = '/capacity/dashboard/'
STAFF, PASSWORD = 'grace', 'lanes-page-acceptance'


@pytest.fixture(scope='module')
def stack(tmp_path_factory):
    """`python -m devstack` on free ports in a VAR_DIR of its own, with a staff user who has a password."""
    tmp = tmp_path_factory.mktemp('make-run')
    launch = Launch(tmp / 'var', tmp / 'launcher.out')
    try:
        launch.url = f'http://127.0.0.1:{launch.port}'
        wait_serving(launch.start())
        # A staff user as docs/operations.md says to make one beside a running `make run`.
        created = subprocess.run(
            [sys.executable, 'manage.py', 'createsuperuser', '--noinput', '--username', STAFF,
             '--email', 'grace@example.org'], cwd=ROOT, env={**launch.env, 'DJANGO_SUPERUSER_PASSWORD': PASSWORD},
            capture_output=True, text=True, timeout=60)
        assert created.returncode == 0, created.stdout + created.stderr
        yield launch
        assert launch.interrupt() == 0, launch.output()
    finally:
        launch.kill_everything()


def wait_serving(launch, timeout=START_SECONDS):
    """Wait until the API the launcher started answers /healthz; fail if the launcher exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launch.collect_pgids()
        if http_get(launch.url + '/healthz', timeout=2)[0] == 200:
            return
        if launch.process.poll() is not None:
            pytest.fail(f'the launcher exited ({launch.process.returncode}) before its API answered:\n'
                        f'{launch.output()}')
        time.sleep(0.2)
    pytest.fail(f'the API did not answer in {timeout} s:\n{launch.output()}')


def text(browser, selector):
    return browser.find_element(By.CSS_SELECTOR, selector).text.strip()


def test_the_admin_is_styled_from_hashed_compressed_css_the_api_serves(stack, browser):
    browser.get(stack.url + '/admin/login/')
    wait_for(lambda: browser.find_elements(By.NAME, 'username'), message='the login form')
    stylesheets = [link.get_attribute('href')
                   for link in browser.find_elements(By.CSS_SELECTOR, 'link[rel=stylesheet]')]
    base = next((href for href in stylesheets if '/static/admin/css/base.' in href), None)
    assert base and re.search(r'/static/admin/css/base\.[0-9a-f]{12}\.css$', base), stylesheets
    css = requests.get(base, headers={'Accept-Encoding': 'gzip'}, timeout=10)
    assert css.status_code == 200, css.text[:300]
    assert css.headers['Content-Type'].startswith('text/css')
    assert css.headers.get('Content-Encoding') == 'gzip'
    assert 'immutable' in css.headers['Cache-Control']  # a hashed name never changes its content
    # And the browser applied it: the admin's header has its colour, not an unstyled page's transparent one.
    header = browser.execute_script("return getComputedStyle(document.getElementById('header')).backgroundColor")
    assert header not in ('', 'transparent', 'rgba(0, 0, 0, 0)'), header


def test_staff_see_the_lanes_page_draw_its_rows_and_its_buttons_act(stack, browser):
    browser.get(stack.url + DASHBOARD)
    assert text(browser, 'h1') == 'Staff only'
    browser.find_element(By.LINK_TEXT, 'Log in with a staff account').click()
    wait_for(lambda: browser.find_elements(By.NAME, 'username'), message='the login form')
    browser.find_element(By.NAME, 'username').send_keys(STAFF)
    browser.find_element(By.NAME, 'password').send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, 'form input[type=submit]').click()
    wait_for(lambda: browser.current_url == stack.url + DASHBOARD, message='the lanes page after login')

    # The page's script ran and read the status: its rows, and the time of its last refresh.
    wait_for(lambda: [row.get_attribute('data-lane') for row in browser.find_elements(
        By.CSS_SELECTOR, '#lanes tbody tr')][:2] == ['api_heavy', 'es2_knn'], message='the lanes')
    wait_for(lambda: text(browser, '#updated') != 'never', message='a refresh')
    assert text(browser, '#mode') in ('shadow', 'enforce')

    # Its buttons act: set es2_knn one higher, then pause and resume it, each saved through the API.
    limit = int(re.match(r'\d+', text(browser, 'tr[data-lane="es2_knn"] td.limit')).group())
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-lane="es2_knn"]')
    row.find_element(By.CSS_SELECTOR, 'input.limit-input').send_keys(str(limit + 1))
    row.find_element(By.CSS_SELECTOR, 'button.set').click()
    wait_for(lambda: f'es2_knn {limit} → {limit + 1}' in text(browser, '#message'), message='the change saved')
    wait_for(lambda: text(browser, 'tr[data-lane="es2_knn"] td.limit').startswith(f'{limit + 1} '),
             message='the new limit drawn')
    assert configured_es2_knn(stack) == limit + 1
    row.find_element(By.CSS_SELECTOR, 'button.pause').click()
    wait_for(lambda: text(browser, 'tr[data-lane="es2_knn"] td.limit') == '0 (paused)', message='the pause')
    assert configured_es2_knn(stack) == 0
    row.find_element(By.CSS_SELECTOR, 'button.pause').click()
    wait_for(lambda: text(browser, 'tr[data-lane="es2_knn"] td.limit').startswith(f'{limit + 1} '),
             message='the resume')
    assert configured_es2_knn(stack) == limit + 1


def configured_es2_knn(stack):
    """es2_knn's limit in the config in force, read through the API with the demo staff token."""
    token = json.loads((stack.var_dir / 'demo-tokens.json').read_text())['staff_token']
    answer = requests.get(stack.url + '/capacity/config/', headers={'Authorization': f'Token {token}'}, timeout=10)
    assert answer.status_code == 200, answer.text[:300]
    return answer.json()['config']['es2_knn']


def test_the_interactive_api_page_draws_swagger_ui(stack, browser):
    browser.get(stack.url + '/schema/docs/')
    paths = wait_for(lambda: [element.text for element in browser.find_elements(
        By.CSS_SELECTOR, '.opblock-summary-path')], message="Swagger UI's operations")
    shown = {path.replace('\u200b', '').strip() for path in paths}  # Swagger UI breaks long paths
    assert {'/concepts/$match/', '/tasks/{call_id}/'} <= shown
