"""VAR_DIR, where one `make run` keeps its state: the private (mode 600) JSON files, run.lock and run.json."""
import fcntl
import json
import os
from pathlib import Path

from devstack.processes import ROOT


def var_dir():
    """HEAVY_LANES_VAR_DIR, else var/ in the repository."""
    return Path(os.environ.get('HEAVY_LANES_VAR_DIR') or ROOT / 'var').resolve()


def read_private(path):
    """The JSON document in `path`, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_private(path, document):
    """Write `document` as JSON to `path`, readable by its owner only, replacing the file atomically."""
    temporary = path.with_name(f'.{path.name}.tmp')
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, 'w') as handle:
        json.dump(document, handle, indent=2)
        handle.write('\n')
    os.replace(temporary, path)


def lock_run(var):
    """Take VAR_DIR/run.lock, held for a whole run (one launcher per VAR_DIR): the open lock file, or None
    when another launcher holds it (its pid is in run.json, see holder())."""
    lock = open(var / 'run.lock', 'a+')  # noqa: SIM115 - held (flock) until unlock_run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def holder(var):
    """The pid of the launcher running in `var` as its run.json says, or '?'."""
    return (read_private(var / 'run.json') or {}).get('launcher', '?')


def write_run(var, redis_url, children):
    """run.json: the launcher's pid and each child's pid, process group and log, while it runs."""
    write_private(var / 'run.json', {
        'launcher': os.getpid(),
        'var_dir': str(var),
        'redis_url': redis_url,
        'children': {name: {'pid': child.pid, 'pgid': child.pid, 'log': str(child.log_path)}
                     for name, child in children.items()},
    })


def unlock_run(var, lock):
    """Remove run.json and release run.lock."""
    try:
        (var / 'run.json').unlink()
    except FileNotFoundError:
        pass
    lock.close()
