import pytest

from concepts.matching.embedders import make_embedder
from concepts.matching.index import LexicalIndex, SemanticIndex
from concepts.matching.table import ConceptTable
from concepts.terminology import read_tiny


@pytest.fixture(scope='session')
def tiny_table():
    return ConceptTable.build(read_tiny().concepts)


@pytest.fixture(scope='session')
def tiny_lexical(tiny_table):
    return LexicalIndex.build(tiny_table)


@pytest.fixture(scope='session')
def tiny_semantic(tiny_table):
    return SemanticIndex.build(tiny_table, make_embedder('tfidf-svd'))


@pytest.fixture(scope='session')
def tiny_minilm(tiny_table):
    return SemanticIndex.build(tiny_table, make_embedder('minilm'))


@pytest.fixture
def tiny_source(db):
    """The tiny terminology loaded into the database; its Source."""
    from concepts.loader import load_terminology
    from concepts.models import Source

    terminology = read_tiny()
    load_terminology(terminology)
    return Source.objects.get(org=terminology.org, mnemonic=terminology.mnemonic)
