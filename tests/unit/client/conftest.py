"""Fixtures for the client tests: a fake API on 127.0.0.1, a Client for it, and a recording sleep."""
import threading

import pytest

from heavy_lanes_client import Client
from tests.unit.client.fake_api import FakeApi


@pytest.fixture
def api():
    fake = FakeApi().start()
    yield fake
    fake.stop()


@pytest.fixture
def client(api):
    with Client(api.url, 't-core', timeout=(2.0, 5.0)) as value:
        yield value


class Sleeps:
    """A Run's sleep: records each wait it was asked for and waits only a moment (or until stopped)."""

    def __init__(self, real=0.005):
        self.asked = []
        self.real = real
        self.lock = threading.Lock()

    def __call__(self, seconds, stop):
        with self.lock:
            self.asked.append(seconds)
        return stop.wait(min(seconds, self.real))


@pytest.fixture
def sleeps():
    return Sleeps()
