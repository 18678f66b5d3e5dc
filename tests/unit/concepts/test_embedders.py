import importlib.util

import numpy as np
import pytest

from concepts.errors import EmbedderUnavailable, UnknownEmbedder
from concepts.matching.embedders import make_embedder


def test_tfidf_svd_vectors_are_unit_length_and_shrink_to_a_small_source():
    embedder = make_embedder('tfidf-svd').fit(['renal cyst', 'kidney cyst', 'short stature', 'tall stature'])
    vectors = embedder.embed(['renal cyst', 'Short Statures'])
    assert vectors.dtype == np.float32 and vectors.shape == (2, 3)  # fewer dimensions than texts
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_a_text_sharing_no_character_grams_with_the_source_embeds_to_zero():
    embedder = make_embedder('tfidf-svd').fit(['renal cyst', 'kidney cyst', 'short stature', 'tall stature'])
    assert not embedder.embed(['xqzw']).any()  # cosine 0 with everything, not NaN


def test_tfidf_svd_cache_key_names_its_settings_and_library_version():
    import sklearn
    assert make_embedder('tfidf-svd').cache_key == f'tfidf-svd-256d-35-sklearn{sklearn.__version__}'


def test_an_unknown_embedder_is_refused_with_the_known_names():
    known = 'known: sentence-transformers, tfidf-svd'
    with pytest.raises(UnknownEmbedder, match=f"unknown embedder 'word2vec'; {known}"):
        make_embedder('word2vec')


def test_the_sentence_model_embedder_without_its_packages_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'sentence_transformers' else real(name, *a))
    with pytest.raises(EmbedderUnavailable, match='requirements/ml.txt'):
        make_embedder('sentence-transformers')
