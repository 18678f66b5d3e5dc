import pytest

from concepts.matching import store
from concepts.terminology import read_tiny


@pytest.fixture
def isolated_indexes(settings, tmp_path):
    """Indexes under this test's own VAR_DIR, and an empty in-process cache before and after."""
    settings.VAR_DIR = tmp_path
    store.clear_cache()
    yield tmp_path / 'indexes'
    store.clear_cache()


@pytest.fixture
def tiny_source(db, isolated_indexes):
    """The tiny terminology loaded into the database; its Source."""
    from concepts.loader import load_terminology
    from concepts.models import Source

    terminology = read_tiny()
    load_terminology(terminology)
    return Source.objects.get(org=terminology.org, mnemonic=terminology.mnemonic)
