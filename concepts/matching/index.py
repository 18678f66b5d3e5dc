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

    def scores(self, queries):
        """(queries x entries scores, queries x concepts: each concept's best score)."""
        scores = self.entry_scores(queries)
        return scores, self.table.concept_max(scores)

    def search(self, queries, k):
        """For each query, up to `k` `Hit`s, best first."""
        results = []
        if not len(self.table):
            return [[] for _ in queries]
        for start in range(0, len(queries), QUERY_BATCH):
            batch = queries[start:start + QUERY_BATCH]
            scores, best = self.scores(batch)
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
    """Entries embedded as unit vectors; with definitions (`definition_vectors`, one per concept that has one,
    of concept `definition_owner[i]`), a concept's score is the best of its entries' and its definition's
    cosines, and its matched entry is its best entry (a definition is no name to show)."""

    def __init__(self, table, embedder, vectors, definition_vectors=None, definition_owner=None):
        super().__init__(table)
        self.embedder = embedder
        self.vectors = vectors  # (entries x dims) float32, rows L2-normalized
        self.definition_vectors = definition_vectors
        self.definition_owner = definition_owner
        self._entry_of = None

    @property
    def algorithm(self):
        return f'semantic:{self.embedder.name}'

    @classmethod
    def build(cls, table, embedder, progress=None):
        """`progress(step, done, total)`: see the embedder's `index_vectors`."""
        return cls(table, embedder, *embedder.index_vectors(table, progress))

    def entry_scores(self, queries):
        return self._cosines(self.embedder.embed(queries), self.vectors)

    def scores(self, queries):
        embedded = self.embedder.embed(queries)
        scores = self._cosines(embedded, self.vectors)
        best = self.table.concept_max(scores)
        if self.definition_vectors is not None:
            definitions = self._cosines(embedded, self.definition_vectors)
            owner = self.definition_owner  # one definition per concept: no owner twice in this assignment
            best[:, owner] = np.maximum(best[:, owner], definitions)
        return scores, best

    @staticmethod
    def _cosines(queries, vectors):
        # Both sides are unit vectors, so one matrix product is the exact kNN. The clip keeps float32
        # rounding (1.0000005) from showing as a cosine above 1.
        scores = queries @ vectors.T
        return np.clip(scores, -1.0, 1.0, out=scores)

    def stored_vectors(self, texts):
        """The stored vector of each text that is an entry or a definition here, else None (no model run)."""
        if self._entry_of is None:
            stored = {text: self.vectors[entry] for entry, text in enumerate(self.table.texts)}
            if self.definition_vectors is not None:
                for row, concept in enumerate(self.definition_owner.tolist()):
                    stored.setdefault(self.table.definitions[concept], self.definition_vectors[row])
            self._entry_of = stored
        return [self._entry_of.get(text) for text in texts]

    def save(self, directory):
        self.table.save(directory)
        self.embedder.save(directory)
        np.save(Path(directory) / 'vectors.npy', self.vectors, allow_pickle=False)
        if self.definition_vectors is not None:
            np.save(Path(directory) / 'definitions.npy', self.definition_vectors, allow_pickle=False)
            np.save(Path(directory) / 'definition_owner.npy', self.definition_owner, allow_pickle=False)

    @classmethod
    def load(cls, directory, embedder):
        directory = Path(directory)
        vectors = np.load(directory / 'vectors.npy', allow_pickle=False)
        definitions = owner = None
        if (directory / 'definitions.npy').is_file():
            definitions = np.load(directory / 'definitions.npy', allow_pickle=False)
            owner = np.load(directory / 'definition_owner.npy', allow_pickle=False)
        return cls(ConceptTable.load(directory), embedder.load(directory), vectors, definitions, owner)
