"""The house's rules that no linter keeps: no module grows past MAX_LINES (tests and migrations aside; the
benchmarks and tools count), so a module that does too much is split while it is still easy to split.
The layers (import-linter) and the style (ruff) are checked by `make test` itself, beside this."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450


def tracked_python_files():
    listed = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '*.py'], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed
            if not name.startswith('tests/') and '/migrations/' not in name and (ROOT / name).exists()]


def test_no_module_is_longer_than_the_house_allows():
    files = tracked_python_files()
    assert len(files) > 100  # the tree was read
    long = {str(path.relative_to(ROOT)): lines for path in files
            if (lines := len(path.read_text(encoding='utf-8').splitlines())) > MAX_LINES}
    assert long == {}
