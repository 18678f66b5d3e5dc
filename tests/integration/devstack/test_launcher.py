"""`python -m devstack` (what `make run` starts), end to end in a private VAR_DIR on free ports.

One test, two starts, because the second start is the point: the first creates the database, loads HPO and
mints tokens with its own redis-server (when installed), and prints its banner while the semantic index is
still being built; the second reuses all of that with the embedded Redis. Each start must serve the API and
Flower (behind its basic auth), and each Ctrl-C must leave no process of any group the launcher started.
Every process group seen is SIGKILLed at teardown, pass or fail.
"""
import base64
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from concepts.matching.embedders import make_embedder
from devstack.processes import Child, free_port, http_get, kill_groups, live_members
from heavy_lanes_client import Client
from heavy_lanes_client.models import State

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
READY_MARK = 'Heavy Lanes is running'
# The test process has these from tests/settings.py or pytest-django; the launcher must pick its own.
INHERITED = ('REDIS_URL', 'CELERY_BROKER_URL', 'DJANGO_SETTINGS_MODULE', 'HEAVY_LANES_WORKER_DB',
             'FLOWER_BASIC_AUTH', 'FLOWER_UNAUTHENTICATED_API', 'HEAVY_LANES_RUN_REDIS', 'PORT',
             'FLOWER_PORT')


def get(url, headers=None):
    """(status, body) of a GET; status 0 when nothing answered."""
    return http_get(url, headers, timeout=10)


class Launch:
    """One `python -m devstack`, its output in a file, and every process group it reported in run.json."""

    def __init__(self, var_dir, out_path, **env):
        self.var_dir = var_dir
        self.out_path = out_path
        self.port = free_port()
        self.flower_port = free_port()
        self.env = {key: value for key, value in os.environ.items()
                    if key not in INHERITED and not key.startswith('HEAVY_LANES_TEST')}
        # The model-free embedder: this tests the launcher, and the default one's first HPO build (minutes,
        # tests/integration/concepts/test_hpo_match.py) would not fit this test's bounds.
        self.env.update(HEAVY_LANES_VAR_DIR=str(var_dir), PORT=str(self.port),
                        FLOWER_PORT=str(self.flower_port), WEB_CONCURRENCY='2', CONCEPTS_EMBEDDER='tfidf-svd', **env)
        self.process = None
        self.pgids = set()

    def start(self):
        self.started = time.monotonic()
        # In a process group of its own, as in a terminal: the SIGINT below reaches the launcher alone.
        self.process = Child('launcher', [sys.executable, '-m', 'devstack'], self.out_path,
                             cwd=ROOT).start(self.env).process
        self.pgids.add(self.process.pid)
        return self

    def output(self):
        return self.out_path.read_text(errors='replace')

    def collect_pgids(self):
        try:
            run = json.loads((self.var_dir / 'run.json').read_text())
        except (OSError, ValueError):
            return
        self.pgids.update(child['pgid'] for child in run['children'].values())

    def wait_ready(self, timeout=45):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect_pgids()
            if READY_MARK in self.output():
                self.ready_seconds = time.monotonic() - self.started
                self.collect_pgids()
                return self
            if self.process.poll() is not None:
                pytest.fail(f'the launcher exited ({self.process.returncode}) before it was ready:\n'
                            f'{self.output()}')
            time.sleep(0.1)
        pytest.fail(f'not ready in {timeout} s:\n{self.output()}')

    def interrupt(self, timeout=30):
        """Ctrl-C: SIGINT to the launcher alone (its children are in groups of their own)."""
        self.collect_pgids()
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f'the launcher did not stop within {timeout} s:\n{self.output()}')

    def kill_everything(self):
        if self.process is None:
            return
        self.collect_pgids()
        kill_groups(self.pgids)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def launches():
    started = []
    yield started
    for launch in started:
        launch.kill_everything()


def check_serving(launch):
    """The API answers with the demo tokens, the HPO source is loaded, Flower wants its credentials."""
    tokens = json.loads((launch.var_dir / 'demo-tokens.json').read_text())
    by_user = {row['username']: row for row in tokens['tokens']}
    assert {row['tier'] for row in tokens['tokens']} == {'staff', 'core', 'early_access', 'preview'}
    assert tokens['staff_token'] == by_user['demo-staff']['token']
    core = by_user['demo-core']['token']
    assert core in launch.output()  # printed for the person at the terminal

    api = f'http://127.0.0.1:{launch.port}'
    assert get(f'{api}/healthz')[0] == 200
    # No Django debug page: what no view serves is the API's JSON too.
    missing = requests.get(f'{api}/no/such/path', timeout=10)
    assert missing.status_code == 404 and missing.json()['error_code'] == 'not_found', missing.text[:300]
    assert get(f'{api}/sources/')[0] == 401
    # Only the names it listens on are its hosts: a forged Host gets no links to another site, but a 400.
    forged = requests.get(f'{api}/tasks/', headers={'Host': 'evil.example', 'Authorization': f'Token {core}'},
                          timeout=10)
    assert forged.status_code == 400 and forged.json()['error_code'] == 'bad_request', forged.text[:300]
    assert get(f'http://localhost:{launch.port}/healthz')[0] == 200
    status, body = get(f'{api}/sources/', {'Authorization': f'Token {core}'})
    assert status == 200
    hpo = {source['url']: source for source in json.loads(body)}['/orgs/HPO/sources/HPO/']
    assert hpo['concept_count'] > 10000
    assert '--source /orgs/HPO/sources/HPO/' in launch.output()

    credentials = json.loads((launch.var_dir / 'flower-credentials.json').read_text())
    basic = base64.b64encode(f'{credentials["username"]}:{credentials["password"]}'.encode()).decode()
    flower = f'http://127.0.0.1:{launch.flower_port}/api/workers'
    assert get(flower)[0] == 401
    assert get(flower, {'Authorization': f'Basic {basic}'})[0] == 200
    metrics = f'http://127.0.0.1:{launch.flower_port}/metrics'  # Flower serves it without auth on its own
    assert get(metrics)[0] == 401
    assert get(metrics, {'Authorization': f'Basic {basic}'})[0] == 200
    return tokens


def check_printed_client_command(launch):
    """The client command the banner prints completes a 50-row semantic match, no row failed."""
    line = next(line.strip() for line in launch.output().splitlines() if 'heavy_lanes_client match' in line)
    command = shlex.split(line)
    assert command[:3] == ['.venv/bin/python', '-m', 'heavy_lanes_client'] and '--semantic' in command
    result = subprocess.run([sys.executable, *command[1:], '--no-progress'], cwd=ROOT, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r'\b50\b', result.stdout + result.stderr)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f'{what}: not within {timeout} s')


def hold_the_semantic_build(launch):
    """Once the prepare step built the lexical index, take the semantic part's lock as a build elsewhere
    would: the launcher's build then waits for it. Returns the open lock file (close it to let go)."""
    lexical = wait_for(lambda: next((launch.var_dir / 'indexes').glob('HPO/HPO/*/lexical-bm25'), None), 60,
                       f'the lexical index in {launch.var_dir}')
    held = open(lexical.parent / f'semantic-{make_embedder("tfidf-svd").cache_key}.lock', 'a+b')  # noqa: SIM115
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)
    return held


def semantic_index_state(launch, tokens):
    status, body = get(f'http://127.0.0.1:{launch.port}/capacity/status/',
                       {'Authorization': f'Token {tokens["staff_token"]}'})
    assert status == 200, body
    return json.loads(body)['indexes']['/orgs/HPO/sources/HPO/']['semantic']['state']


def check_a_semantic_call_waits_in_its_queue_for_the_index(launch, held):
    """The banner is out and the semantic index not built: a semantic call is accepted, waits in its queue,
    and is answered once the build ends and the lane workers start."""
    tokens = json.loads((launch.var_dir / 'demo-tokens.json').read_text())
    assert 'semantic index of /orgs/HPO/sources/HPO/: building now' in launch.output()
    assert semantic_index_state(launch, tokens) == 'building'
    core = next(row['token'] for row in tokens['tokens'] if row['tier'] == 'core')
    with Client(f'http://127.0.0.1:{launch.port}', core) as client:
        handle = client.submit_match(['stomach ache'], '/orgs/HPO/sources/HPO/', semantic=True)
        assert client.get_task(handle).state == State.QUEUED
        held.close()  # the build goes on
        task = client.wait(handle, timeout=150)
    assert task.state == State.SUCCEEDED, task
    assert task.result[0]['results'], task.result
    assert semantic_index_state(launch, tokens) == 'ready'
    assert launch.output().index(READY_MARK) < launch.output().index('indexes: done')


def check_stopped(launch, code):
    assert code == 0, launch.output()
    assert 'Stopped everything' in launch.output()
    assert launch.pgids - {launch.process.pid}, 'no child process groups were seen'
    assert live_members(launch.pgids) == [], launch.output()
    assert not (launch.var_dir / 'run.json').exists()


def test_a_second_start_reuses_the_database_and_ctrl_c_leaves_nothing_running(tmp_path, launches):
    var_dir = tmp_path / 'var'

    first = Launch(var_dir, tmp_path / 'first.out')
    launches.append(first)
    held = hold_the_semantic_build(first.start())
    first.wait_ready()
    check_a_semantic_call_waits_in_its_queue_for_the_index(first, held)
    first_tokens = check_serving(first)
    check_printed_client_command(first)
    check_stopped(first, first.interrupt())

    second = Launch(var_dir, tmp_path / 'second.out', HEAVY_LANES_RUN_REDIS='embedded')
    launches.append(second)
    second.start().wait_ready()
    assert 'embedded fakeredis' in second.output()
    assert check_serving(second) == first_tokens  # the same users and tokens, not new ones
    setup_log = (var_dir / 'log' / 'setup.log').read_text()
    assert 'No migrations to apply' in setup_log
    assert 'already up to date' in setup_log
    prepared = float(re.search(r'Preparing the database.*\n\s+done in ([0-9.]+) s', second.output()).group(1))
    assert prepared < 15, second.output()
    check_stopped(second, second.interrupt())
    print(f'first start ready in {first.ready_seconds:.1f} s, second in {second.ready_seconds:.1f} s '
          f'(database steps {prepared:.1f} s)')
