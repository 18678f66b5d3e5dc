"""Okapi BM25 over a table's entries, vectorized with scipy.sparse.

Each entry (a name or a synonym) is one document. Fitting precomputes every (entry, term) weight

    w = idf(term) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))
    idf(term) = ln(1 + (N - df + 0.5) / (df + 0.5))         (Lucene's form: never negative)

into one sparse (terms x entries) matrix, so scoring a batch of queries is one sparse product: a query's
score for an entry is the sum of the weights of the distinct query terms the entry contains.
"""
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from concepts.matching.text import tokens

K1 = 1.2
B = 0.75


class BM25:
    def __init__(self, vocabulary, weights):
        self.vocabulary = vocabulary        # term -> row of `weights`
        self.weights = weights              # csr (terms x entries), float32

    @classmethod
    def fit(cls, texts, k1=K1, b=B):
        vocabulary = {}
        rows, cols, tfs = [], [], []
        lengths = np.zeros(len(texts), dtype=np.float64)
        for doc, text in enumerate(texts):
            counts = {}
            for token in tokens(text):
                counts[token] = counts.get(token, 0) + 1
            lengths[doc] = sum(counts.values())
            for token, count in counts.items():
                rows.append(vocabulary.setdefault(token, len(vocabulary)))
                cols.append(doc)
                tfs.append(count)
        n_docs, n_terms = len(texts), len(vocabulary)
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        tfs = np.asarray(tfs, dtype=np.float64)
        df = np.bincount(rows, minlength=n_terms).astype(np.float64)
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        avg_len = lengths.mean() if n_docs and lengths.mean() > 0 else 1.0
        norm = k1 * (1 - b + b * lengths[cols] / avg_len)
        values = idf[rows] * tfs * (k1 + 1) / (tfs + norm)
        weights = sp.csr_matrix((values.astype(np.float32), (rows, cols)), shape=(n_terms, n_docs))
        return cls(vocabulary, weights)

    def query_matrix(self, queries):
        """csr (queries x terms): 1 for each distinct known term of each query."""
        rows, cols = [], []
        for row, query in enumerate(queries):
            for term in {self.vocabulary[t] for t in tokens(query) if t in self.vocabulary}:
                rows.append(row)
                cols.append(term)
        data = np.ones(len(rows), dtype=np.float32)
        return sp.csr_matrix((data, (rows, cols)), shape=(len(queries), len(self.vocabulary)))

    def scores(self, queries):
        """Dense (queries x entries) float32 BM25 scores; 0 where an entry shares no term."""
        return (self.query_matrix(queries) @ self.weights).toarray()

    # --- persistence ------------------------------------------------------------------------------------
    def save(self, directory):
        directory = Path(directory)
        terms = sorted(self.vocabulary, key=self.vocabulary.get)
        (directory / 'bm25_terms.json').write_text(json.dumps(terms, ensure_ascii=False), encoding='utf-8')
        sp.save_npz(directory / 'bm25_weights.npz', self.weights)

    @classmethod
    def load(cls, directory):
        directory = Path(directory)
        terms = json.loads((directory / 'bm25_terms.json').read_text(encoding='utf-8'))
        weights = sp.load_npz(directory / 'bm25_weights.npz').tocsr()
        return cls({term: index for index, term in enumerate(terms)}, weights)
