"""The launcher on a machine without the development requirements: the embedded Redis says what to install."""
import io
import sys

import pytest

from devstack import redis_server
from devstack.launcher import Launcher, Stop


@pytest.mark.parametrize('wanted, redis_server_binary', [
    ('embedded', '/usr/bin/redis-server'),  # asked for
    ('auto', None),                         # the fallback when redis-server isn't installed
])
def test_the_embedded_redis_without_fakeredis_names_the_requirements_to_install(
        wanted, redis_server_binary, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'fakeredis', None)  # as on a machine with only requirements/base.txt
    monkeypatch.setattr(redis_server, 'server_binary', lambda: redis_server_binary)
    monkeypatch.delenv('REDIS_URL', raising=False)
    monkeypatch.setenv('HEAVY_LANES_RUN_REDIS', wanted)
    monkeypatch.setenv('HEAVY_LANES_VAR_DIR', str(tmp_path))
    launcher = Launcher(out=io.StringIO())
    monkeypatch.setattr(launcher, 'start', lambda child: pytest.fail(f'started {child.name}'))
    with pytest.raises(Stop) as stopped:
        launcher.start_redis()
    assert stopped.value.code == 1
    assert 'The embedded Redis needs fakeredis, from requirements/dev.txt' in str(stopped.value)
