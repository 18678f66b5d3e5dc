"""deploy/nginx.conf in front of the API: a real nginx on a loopback port, with the deployment's own site
config (only its upstream and listen address changed), proxying to the API's live test server.

- A client's `X-Request-Id` reaches the API and comes back as it was sent (docs/api.md).
- A request without one gets nginx's request id, and the API answers with that same id.
"""
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which('nginx') is None, reason='needs nginx')]


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def site_for(upstream, port):
    """deploy/nginx.conf with its upstream servers replaced by `upstream` and listening on `port`."""
    site = (ROOT / 'deploy' / 'nginx.conf').read_text()
    assert 'listen 80;' in site
    site = site.replace('listen 80;', f'listen 127.0.0.1:{port};')
    head, _, rest = site.partition('upstream heavy_lanes_api {')
    _, _, rest = rest.partition('keepalive 32;')
    return f'{head}upstream heavy_lanes_api {{\n    server {upstream};\n    keepalive 32;{rest}'


@pytest.fixture
def proxy(live_server, tmp_path):
    """The URL of nginx in front of the live server, and the file where it logs each request's own id."""
    port = free_port()
    upstream = live_server.url.removeprefix('http://')
    ids = tmp_path / 'ids.log'
    conf = tmp_path / 'nginx.conf'
    conf.write_text(
        f'daemon off;\nuser root;\nworker_processes 1;\npid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\n'
        f'events {{ worker_connections 64; }}\nhttp {{\n'
        f'log_format ids "$request_id";\naccess_log {ids} ids;\n'
        f'client_body_temp_path {tmp_path}/body;\nproxy_temp_path {tmp_path}/proxy;\n'
        f'{site_for(upstream, port)}\n}}\n')
    checked = subprocess.run(['nginx', '-t', '-c', str(conf), '-e', f'{tmp_path}/error.log'],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(['nginx', '-c', str(conf), '-e', f'{tmp_path}/error.log'])
    url = f'http://127.0.0.1:{port}'
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + '/healthz', timeout=2)
                break
            except requests.ConnectionError:
                assert process.poll() is None, (tmp_path / 'error.log').read_text()
                assert time.monotonic() < deadline, 'nginx did not start listening'
                time.sleep(0.05)
        assert len(logged_ids(ids, 1)) == 1  # the request that found it listening
        yield url, ids
    finally:
        process.send_signal(signal.SIGQUIT)
        process.wait(timeout=30)


def logged_ids(path, count):
    """The request ids nginx logged, once it has logged `count` of them (it writes after answering)."""
    deadline = time.monotonic() + 10
    while True:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def test_a_clients_request_id_passes_through_the_proxy_and_comes_back(proxy):
    url, ids = proxy
    response = requests.get(url + '/healthz', headers={'X-Request-Id': 'mapper-run-7.row-12'}, timeout=10)
    assert response.headers['X-Request-Id'] == 'mapper-run-7.row-12'


def test_a_request_without_an_id_gets_the_proxys_which_the_api_keeps(proxy):
    url, ids = proxy
    response = requests.get(url + '/healthz', timeout=10)
    made = response.headers['X-Request-Id']
    assert re.fullmatch(r'[0-9a-f]{32}', made)
    # nginx's own $request_id for this request, not one the API made for a request that came without any.
    assert logged_ids(ids, 2)[1:] == [made]
