"""Fixtures of the acceptance tests: a real headless browser, and the real lane workers of the worker tests
(tests/integration/workers/conftest.py) against the real Redis."""
import pytest

from tests.acceptance import browser as browsers

# Fixtures, used by name.
from tests.integration.workers.conftest import broker, lanes_redis, start_worker, tiny_source  # noqa: F401


@pytest.fixture
def browser(tmp_path):
    """A selenium WebDriver on a headless chromium of this test's own, stopped (by pid) at teardown."""
    driver = browsers.start(tmp_path / 'chromium-profile', tmp_path / 'chromedriver.log')
    driver.implicitly_wait(0)  # every wait is an explicit poll with a deadline (browsers.wait_for)
    try:
        yield driver
    finally:
        browsers.stop(driver)
