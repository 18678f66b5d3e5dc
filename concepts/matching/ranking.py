"""Top-k selection with deterministic ties, shared by every matcher."""
from dataclasses import dataclass

import numpy as np

# Scores are compared and shown at this precision, so ties are the ties a user sees. Coarser rounding
# would tie near-duplicates that the embeddings do tell apart (IgG2 vs IgG4 levels differ by ~1e-5);
# finer would let float32 noise from batching (~1e-7) reorder them.
SCORE_DECIMALS = 6


@dataclass(frozen=True)
class Hit:
    """One candidate for one query: a concept index into the table, its score and its best entry."""
    concept: int
    score: float
    entry: int


def top_k(scores, k, min_score=None):
    """Indices of the `k` best of `scores` (1-d), best first, equal rounded scores by lower index.

    Indices below `min_score` (after rounding) are never returned. Runs in O(n) plus O(m log m) for the m
    indices that tie with or beat the k-th score.
    """
    rounded = np.round(scores.astype(np.float64), SCORE_DECIMALS)
    if min_score is not None:
        eligible = np.flatnonzero(rounded >= min_score)
    else:
        eligible = np.arange(len(rounded))
    if k <= 0 or not len(eligible):
        return np.empty(0, dtype=np.int64)
    values = rounded[eligible]
    if len(eligible) > k:
        # Keep everything tied with the k-th value, so the tie-break by index below sees all of them.
        kth = np.partition(values, len(values) - k)[len(values) - k]
        keep = values >= kth
        eligible, values = eligible[keep], values[keep]
    order = np.lexsort((eligible, -values))
    return eligible[order][:k]
