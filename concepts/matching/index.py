"""Retrieval indexes over a `ConceptTable`: `LexicalIndex` (BM25) and `SemanticIndex` (embeddings + kNN).

Both score every entry for a batch of queries, keep each concept's best entry, and return the top k
concepts per query as `Hit`s, best first, equal scores by code. Both save to and load from a directory
(see `concepts.matching.store` for where, and how a build is shared between processes).
"""
from pathlib import Path

import numpy as np

from concepts.matching.bm25 import BM25
from concepts.matching.ranking import SCORE_DECIMALS, Hit, top_k
from concepts.matching.table import ConceptTable

QUERY_BATCH = 256  # queries scored per matrix product: bounds memory at QUERY_BATCH x entries floats
MIN_LEXICAL_SCORE = 10 ** -SCORE_DECIMALS  # a lexical candidate shares at least one term with the query


class _Index:
    min_score = None

    def __init__(self, table):
        self.table = table

    def entry_scores(self, queries):
        raise NotImplementedError

    def search(self, queries, k):
        """For each query, up to `k` `Hit`s, best first."""
        results = []
        if not len(self.table):
            return [[] for _ in queries]
        for start in range(0, len(queries), QUERY_BATCH):
            batch = queries[start:start + QUERY_BATCH]
            scores = self.entry_scores(batch)
            best = self.table.concept_max(scores)
            for row in range(len(batch)):
                hits = []
                for concept in top_k(best[row], k, self.min_score):
                    concept = int(concept)
                    hits.append(Hit(concept, round(float(best[row, concept]), SCORE_DECIMALS),
                                    self.table.best_entry(scores[row], concept)))
                results.append(hits)
        return results


class LexicalIndex(_Index):
    algorithm = 'bm25'
    min_score = MIN_LEXICAL_SCORE

    def __init__(self, table, bm25):
        super().__init__(table)
        self.bm25 = bm25

    @classmethod
    def build(cls, table):
        return cls(table, BM25.fit(table.texts))

    def entry_scores(self, queries):
        return self.bm25.scores(queries)

    def save(self, directory):
        self.table.save(directory)
        self.bm25.save(directory)

    @classmethod
    def load(cls, directory):
        return cls(ConceptTable.load(directory), BM25.load(directory))


class SemanticIndex(_Index):
    def __init__(self, table, embedder, vectors):
        super().__init__(table)
        self.embedder = embedder
        self.vectors = vectors  # (entries x dims) float32, rows L2-normalized

    @property
    def algorithm(self):
        return f'semantic:{self.embedder.name}'

    @classmethod
    def build(cls, table, embedder):
        if embedder.fitted_on_source:
            embedder.fit(table.texts)
        return cls(table, embedder, embedder.embed(table.texts))

    def entry_scores(self, queries):
        # Cosine similarity: both sides are unit vectors, so one matrix product is the exact kNN. The clip
        # keeps float32 rounding (1.0000005) from showing as a cosine above 1.
        scores = self.embedder.embed(queries) @ self.vectors.T
        return np.clip(scores, -1.0, 1.0, out=scores)

    def save(self, directory):
        self.table.save(directory)
        self.embedder.save(directory)
        np.save(Path(directory) / 'vectors.npy', self.vectors, allow_pickle=False)

    @classmethod
    def load(cls, directory, embedder):
        vectors = np.load(Path(directory) / 'vectors.npy', allow_pickle=False)
        return cls(ConceptTable.load(directory), embedder.load(directory), vectors)
