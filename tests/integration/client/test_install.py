"""The client installs on its own: `pip install` of heavy_lanes_client/ into a fresh virtual environment
gives the `heavy-lanes` command (and `python -m heavy_lanes_client`), with requests as its only dependency.

pip resolves requests (and the build's setuptools) from the package index this machine is set up with,
as a user's pip would; without an index the test is skipped locally and fails in CI.
"""
import json
import os
import shutil
import subprocess
import sys
import venv

import pytest

import heavy_lanes_client
from tests.conftest import missing_service

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# What a fresh environment may hold after the install: pip's own, the client, and requests with its own
# dependencies. Django, redis, celery or anything else of the service would show the client needs them.
ALLOWED = {'pip', 'setuptools', 'heavy-lanes-client', 'requests', 'urllib3', 'idna', 'charset-normalizer',
           'certifi'}


def run(*command, **options):
    return subprocess.run(command, capture_output=True, text=True, timeout=300, **options)


def test_pip_installs_the_client_alone_with_a_heavy_lanes_command(tmp_path):
    source = tmp_path / 'src' / 'heavy_lanes_client'
    elsewhere = tmp_path / 'elsewhere'  # the commands run here: no copy of the package on their path
    elsewhere.mkdir()
    # A copy, so the build leaves nothing behind in the work tree.
    shutil.copytree(os.path.join(ROOT, 'heavy_lanes_client'), source,
                    ignore=shutil.ignore_patterns('__pycache__', 'build', '*.egg-info'))
    env_dir = tmp_path / 'env'
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python, command = env_dir / 'bin' / 'python', env_dir / 'bin' / 'heavy-lanes'
    clean = {key: value for key, value in os.environ.items() if key not in ('PYTHONPATH', 'VIRTUAL_ENV')}

    installed = run(str(python), '-m', 'pip', 'install', '--disable-pip-version-check', str(source), env=clean)
    if installed.returncode != 0 and 'No matching distribution' in installed.stdout + installed.stderr:
        missing_service(f'no package index for pip: {installed.stderr[-300:]}')
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]

    listed = run(str(python), '-m', 'pip', 'list', '--format=json', env=clean)
    names = {item['name'].lower() for item in json.loads(listed.stdout)}
    assert 'heavy-lanes-client' in names and names <= ALLOWED, names - ALLOWED

    version = run(str(command), '--version', env=clean, cwd=elsewhere)
    assert (version.returncode, version.stdout.strip()) == (0, f'heavy-lanes {heavy_lanes_client.__version__}')
    module = run(str(python), '-m', 'heavy_lanes_client', '--version', env=clean, cwd=elsewhere)
    assert module.stdout.strip() == f'python -m heavy_lanes_client {heavy_lanes_client.__version__}'
    # Every module imports there (the load generator too), far from this repository.
    probe = ('import pkgutil, importlib, heavy_lanes_client as p; '
             '[importlib.import_module("heavy_lanes_client." + m.name) for m in pkgutil.iter_modules(p.__path__)]; '
             'print(p.__file__)')
    imported = run(str(python), '-c', probe, env=clean, cwd=elsewhere)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(str(env_dir))
    assert sys.executable != str(python)
