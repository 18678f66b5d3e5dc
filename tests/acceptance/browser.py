"""A real headless browser for the acceptance tests: Debian's chromium driven through its chromedriver by
selenium (WebDriver), each started by this test and stopped by process id.

The flags keep chromium off the network (this machine has none but loopback: background fetches, component
updates and sync would be refused connections, and QUIC would try UDP) and out of every other run's profile
(a fresh --user-data-dir). Without chromium and chromedriver the test skips locally and fails in CI
(`apt-get install -y chromium chromium-driver`; .ci/run installs them).
"""
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from tests.conftest import missing_service

FLAGS = ('--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync',
         '--window-size=1280,1100')


def binaries():
    """(chromium, chromedriver) paths, or a skip locally and a failure in CI."""
    chromium = shutil.which('chromium')
    driver = shutil.which('chromedriver')
    if not (chromium and driver):
        missing_service('no chromium or chromedriver (apt-get install -y chromium chromium-driver)')
    return chromium, driver


def descendants(pid):
    """Every process under `pid` (its children, theirs, ...), read from /proc."""
    children = {}
    for entry in Path('/proc').iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # The field after the command name (which may hold spaces, inside parentheses) is the parent.
                parent = int((entry / 'stat').read_text().rsplit(')', 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start(profile_dir, log_path):
    """A selenium WebDriver on a fresh headless chromium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f'--user-data-dir={profile_dir}'):
        options.add_argument(flag)
    # Given both paths, selenium runs them as they are and never looks for (or downloads) another driver.
    service = Service(executable_path=driver_path, log_output=str(log_path))
    return webdriver.Chrome(service=service, options=options)


def is_chromium(pid):
    """Whether `pid` is still a chromium or chromedriver process (not a new one that took its number)."""
    try:
        return b'chrom' in Path(f'/proc/{pid}/cmdline').read_bytes()
    except OSError:
        return False


def stop(driver):
    """Close the browser, then make sure chromedriver and every chromium process it started are gone."""
    process = driver.service.process
    started = [process.pid, *descendants(process.pid)] if process is not None else []
    with contextlib.suppress(Exception):  # a browser that already died can't answer quit
        driver.quit()
    for pid in started:
        if is_chromium(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout=30, interval=0.1, message='condition'):
    """Poll `predicate` until it returns something true (returned), or fail after `timeout` seconds."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (StaleElementReferenceException, NoSuchElementException):
            value = None  # the page redrew that part between the find and the read
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f'timed out after {timeout} s waiting for {message}')
