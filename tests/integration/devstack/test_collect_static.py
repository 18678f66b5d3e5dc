"""`make run`'s collectstatic step (devstack.prepare.collect_static) with the service's storage (hashed names,
gzip copies): it collects on the first start, skips a start whose sources are unchanged, and collects again
when a source changed or the collected files are gone. The sources here are one folder of the test's own, so
each collect takes milliseconds; tests/acceptance/test_make_run_pages.py serves the real ones."""
import json
import shutil

from devstack.prepare import collect_static

CSS = 'body { color: %s; }\n' + '.lane { margin: 0 auto; padding: 0.5em 1em; }\n' * 40  # long enough to gzip


def served_name(static_root, name):
    """The hashed name the manifest gives `name`."""
    return json.loads((static_root / 'staticfiles.json').read_text())['paths'][name]


def test_static_files_are_collected_again_only_when_a_source_changed_or_they_are_gone(settings, tmp_path):
    sources, static_root = tmp_path / 'sources', tmp_path / 'static'
    sources.mkdir()
    (sources / 'page.css').write_text(CSS % 'teal')
    settings.STATICFILES_FINDERS = ['django.contrib.staticfiles.finders.FileSystemFinder']
    settings.STATICFILES_DIRS = [sources]
    settings.STATIC_ROOT = static_root
    settings.VAR_DIR = tmp_path
    settings.STORAGES = {**settings.STORAGES,
                         'staticfiles': {'BACKEND': 'whitenoise.storage.CompressedManifestStaticFilesStorage'}}

    assert collect_static() is True
    first = served_name(static_root, 'page.css')
    assert first != 'page.css' and (static_root / first).exists() and (static_root / f'{first}.gz').exists()

    assert collect_static() is False  # the same sources: nothing to do

    (sources / 'page.css').write_text(CSS % 'darkslateblue')  # another size, whatever the clock's grain
    assert collect_static() is True
    second = served_name(static_root, 'page.css')
    assert second != first and (static_root / second).exists()

    shutil.rmtree(static_root)
    assert collect_static() is True
    assert served_name(static_root, 'page.css') == second
