"""The production image (deploy/Dockerfile) installs requirements/base.txt only. fakeredis and lupa, which the
lane-store tests and make run's embedded Redis need, are development requirements, and nothing the image
copies imports them or devstack/ (which the image doesn't copy)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEV_ONLY = {'fakeredis', 'lupa', 'devstack'}  # devstack is a package of ours, the others requirements


def requirement_names(path):
    names = set()
    for line in path.read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if line and not line.startswith('-'):
            names.add(re.split(r'[\[=<>~!;\s]', line, maxsplit=1)[0].lower())
    return names


def shipped_packages():
    """The folders deploy/Dockerfile copies into the image (`COPY api/ api/`)."""
    return re.findall(r'^COPY (\w+)/ ', (ROOT / 'deploy' / 'Dockerfile').read_text(), re.MULTILINE)


def top_level_imports(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def test_fakeredis_and_lupa_are_development_requirements_only():
    assert requirement_names(ROOT / 'requirements' / 'base.txt') & DEV_ONLY == set()
    assert {'fakeredis', 'lupa'} <= requirement_names(ROOT / 'requirements' / 'dev.txt')


def test_no_module_the_image_ships_imports_a_development_only_package():
    packages = shipped_packages()
    assert {'api', 'capacity', 'workers', 'concepts'} <= set(packages)
    offenders = [f'{path.relative_to(ROOT)} imports {name}'
                 for package in packages for path in sorted((ROOT / package).rglob('*.py'))
                 for name in sorted(top_level_imports(path) & DEV_ONLY)]
    assert offenders == []
