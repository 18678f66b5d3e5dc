"""A linear adapter fitted on a terminology's own synonyms: the sentence model's space bent toward the source.

A general sentence model puts ``Renal cyst`` and ``Kidney cyst`` near each other, but not always nearer
than to ``Renal cortical cyst``; the terminology itself says which texts mean the same concept. At index
build, `fit` learns one matrix ``W`` (dims x dims, started at the identity) such that the unit vectors of
``W @ v`` of two texts of one concept (its name, synonyms and definition) are closer than those of any two
texts of different concepts: SapBERT's training on synonym pairs (Liu et al., 2021: an InfoNCE loss with
the other pairs of a batch as negatives), at the scale of one linear layer over frozen sentence vectors,
so it takes seconds on a CPU and can't forget what the model knew (``W`` stays near the identity).

What it is fitted on is only what `training_pairs` takes from the `ConceptTable` being indexed: a text
that is not in the index (a held-out synonym, a user's row) can't have been seen. The fit is deterministic
(a fixed seed), so one table gives one adapter.

Written by hand: the loss and its gradient are 30 lines of numpy, and the libraries that do contrastive
training (sentence-transformers, PyTorch) are what this embedder exists to avoid installing.
"""
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

EPOCHS = 8
BATCH = 1024
LEARNING_RATE = 2e-3
TEMPERATURE = 0.05
REGULARIZATION = 1e-4  # pull toward the identity
SEED = 0
MAX_PAIRS_PER_CONCEPT = 45  # a concept with 10 texts gives all its 45 pairs; a larger one a sample of them


@dataclass(frozen=True)
class Pairs:
    """Texts of one concept paired: `left[i]` and `right[i]` index `texts`; `owner[i]` is their concept."""
    texts: tuple[str, ...]
    left: np.ndarray
    right: np.ndarray
    owner: np.ndarray


def concept_texts(table):
    """The texts the adapter learns from: each concept's entries, then its definition if it has one.
    Returns (texts, owner), texts in table order: entry i is texts[i]; definitions follow the entries."""
    texts = list(table.texts)
    owner = table.owner.tolist()
    for concept, definition in enumerate(table.definitions):
        if definition:
            texts.append(definition)
            owner.append(concept)
    return tuple(texts), np.asarray(owner, dtype=np.int64)


def training_pairs(table, texts=None, owner=None):
    """Every pair of two texts of one concept (at most MAX_PAIRS_PER_CONCEPT a concept, chosen with a fixed
    seed), from the table's names, synonyms and definitions only."""
    if texts is None:
        texts, owner = concept_texts(table)
    rng = np.random.default_rng(SEED)
    by_concept = {}
    for position, concept in enumerate(owner.tolist()):
        by_concept.setdefault(concept, []).append(position)
    left, right, owners = [], [], []
    for concept, positions in by_concept.items():
        pairs = list(combinations(positions, 2))
        if len(pairs) > MAX_PAIRS_PER_CONCEPT:
            pairs = [pairs[i] for i in sorted(rng.choice(len(pairs), MAX_PAIRS_PER_CONCEPT, replace=False))]
        for a, b in pairs:
            left.append(a)
            right.append(b)
            owners.append(concept)
    return Pairs(tuple(texts), np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64),
                 np.asarray(owners, dtype=np.int64))


def _unit(matrix):
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12), np.maximum(norms, 1e-12)


def fit(vectors, pairs, epochs=EPOCHS):
    """The adapter matrix (float32, dims x dims) for `vectors` (one row per text of `pairs.texts`).

    numpy's BLAS runs on one thread here: its products are of a batch (1,024 x 384), small enough that
    BLAS threads spend their time meeting, and on a shared 2-core machine (load average 7-9) one epoch of
    the HPO took 16-18 s on one thread and 33-46 s on two. The matrix is the same either way."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api='blas'):
        return _fit(np.asarray(vectors, dtype=np.float32), pairs, epochs)


def _fit(vectors, pairs, epochs):
    dims = vectors.shape[1]
    identity = np.eye(dims, dtype=np.float32)
    weights = identity.copy()
    if not len(pairs.left):
        return weights
    first, second = np.zeros_like(weights), np.zeros_like(weights)
    rng = np.random.default_rng(SEED)
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(pairs.left))
        for start in range(0, len(order), BATCH):
            chosen = order[start:start + BATCH]
            gradient = _gradient(weights, vectors[pairs.left[chosen]], vectors[pairs.right[chosen]],
                                 pairs.owner[chosen])
            gradient += 2 * REGULARIZATION * (weights - identity)
            step += 1  # Adam
            first = 0.9 * first + 0.1 * gradient
            second = 0.999 * second + 0.001 * gradient * gradient
            weights -= LEARNING_RATE * (first / (1 - 0.9 ** step)) / (np.sqrt(second / (1 - 0.999 ** step)) + 1e-8)
    return weights


def _gradient(weights, left, right, owner):
    """Gradient in `weights` of the symmetric InfoNCE loss of one batch of pairs: pair i's two texts must be
    nearer each other than to the other pairs' texts (those of the same concept are not counted as
    negatives)."""
    count = len(owner)
    a, a_norm = _unit(left @ weights.T)
    b, b_norm = _unit(right @ weights.T)
    logits = a @ b.T / TEMPERATURE
    logits[(owner[:, None] == owner[None, :]) & ~np.eye(count, dtype=bool)] = -1e4
    by_row = np.exp(logits - logits.max(axis=1, keepdims=True))
    by_row /= by_row.sum(axis=1, keepdims=True)
    by_column = np.exp(logits - logits.max(axis=0, keepdims=True))
    by_column /= by_column.sum(axis=0, keepdims=True)
    d_logits = (by_row + by_column - 2 * np.eye(count, dtype=np.float32)) / (2 * count)
    d_a = d_logits @ b / TEMPERATURE
    d_b = d_logits.T @ a / TEMPERATURE
    # Back through the normalization: the part of the gradient along the vector itself vanishes.
    d_left = (d_a - a * (d_a * a).sum(axis=1, keepdims=True)) / a_norm
    d_right = (d_b - b * (d_b * b).sum(axis=1, keepdims=True)) / b_norm
    return (d_left.T @ left + d_right.T @ right).astype(np.float32)


class Adapter:
    """``W`` and how to apply it: unit(vectors @ W.T)."""

    FILE = 'adapter.npy'

    def __init__(self, weights):
        self.weights = np.ascontiguousarray(weights, dtype=np.float32)
        self._transposed = np.ascontiguousarray(self.weights.T)

    def apply(self, vectors):
        return _unit(np.asarray(vectors, dtype=np.float32) @ self._transposed)[0].astype(np.float32)

    def save(self, directory):
        np.save(Path(directory) / self.FILE, self.weights, allow_pickle=False)

    @classmethod
    def load(cls, directory):
        return cls(np.load(Path(directory) / cls.FILE, allow_pickle=False))
