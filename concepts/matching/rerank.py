"""Rerankers: a finer, slower similarity than retrieval, for a query against a handful of candidates.

A candidate is a list of texts (its name, then its synonyms); its score is the best score of any of its
texts against the query, and the text that scored it is what matched. Rerankers are selected by name
(setting ``CONCEPTS_RERANKER``):

- ``fuzzy`` (default): ``0.2 * token Dice + 0.4 * character 3-gram cosine + 0.4 * edit similarity`` on
  normalized text, where the token Dice uses stemmed word sets, and the edit similarity is the better of
  normalized Levenshtein similarity and rapidfuzz's token-sort ratio (word order does not matter). All
  three are in [0, 1], so the score is too; identical normalized texts score 1.
- ``sentence-transformers``: the mean of ``fuzzy`` and the MiniLM cosine (clipped at 0); needs
  requirements/ml.txt.

Every pair of a batch is scored in one pass: the n-gram cosine is one sparse product.
"""
from dataclasses import dataclass

import numpy as np

from concepts.errors import UnknownEmbedder
from concepts.matching.text import normalize, stem

# Chosen on a held-out split with another seed than the one docs/quality.md reports (see bench/quality.py).
TOKEN_WEIGHT, CHAR_WEIGHT, EDIT_WEIGHT = 0.2, 0.4, 0.4
DEFAULT_RERANKER = 'fuzzy'


@dataclass(frozen=True)
class Reranked:
    """One candidate's rerank score and the index of its text that matched (0 = its name)."""
    score: float
    matched: int


class _Strings:
    """Unique normalized strings, so each is vectorized once per batch."""

    def __init__(self):
        self.index = {}

    def add(self, text):
        return self.index.setdefault(normalize(text), len(self.index))

    @property
    def values(self):
        return list(self.index)


class FuzzyReranker:
    name = 'fuzzy'

    def __init__(self):
        from sklearn.feature_extraction.text import HashingVectorizer
        self.vectorizer = HashingVectorizer(analyzer='char_wb', ngram_range=(3, 3), n_features=2 ** 20,
                                            alternate_sign=False, norm='l2', lowercase=False)

    def score_pairs(self, left, right):
        """Scores in [0, 1] of left[i] against right[i] (two equal-length lists of raw strings)."""
        from rapidfuzz import fuzz
        from rapidfuzz.distance import Levenshtein

        strings = _Strings()
        li = np.fromiter((strings.add(text) for text in left), dtype=np.int64, count=len(left))
        ri = np.fromiter((strings.add(text) for text in right), dtype=np.int64, count=len(right))
        values = strings.values
        if not values:
            return np.zeros(0)
        grams = self.vectorizer.transform(values)
        char = np.asarray(grams[li].multiply(grams[ri]).sum(axis=1)).ravel()
        words = [frozenset(stem(token) for token in value.split()) for value in values]
        token = np.empty(len(li))
        edit = np.empty(len(li))
        for pair, (a, b) in enumerate(zip(li.tolist(), ri.tolist())):
            wa, wb = words[a], words[b]
            token[pair] = 2 * len(wa & wb) / (len(wa) + len(wb)) if wa or wb else 0.0
            edit[pair] = max(Levenshtein.normalized_similarity(values[a], values[b]),
                             fuzz.token_sort_ratio(values[a], values[b]) / 100)
        return np.clip(TOKEN_WEIGHT * token + CHAR_WEIGHT * char + EDIT_WEIGHT * edit, 0.0, 1.0)


class SentenceTransformerReranker(FuzzyReranker):
    name = 'sentence-transformers'

    def __init__(self):
        from concepts.matching.embedders import SentenceTransformerEmbedder
        super().__init__()
        self.embedder = SentenceTransformerEmbedder()

    def score_pairs(self, left, right):
        fuzzy = super().score_pairs(left, right)
        strings = _Strings()
        li = [strings.add(text) for text in left]
        ri = [strings.add(text) for text in right]
        if not li:
            return fuzzy
        vectors = self.embedder.embed(strings.values)
        cosine = np.einsum('ij,ij->i', vectors[li], vectors[ri])
        return 0.5 * fuzzy + 0.5 * np.clip(cosine, 0.0, 1.0)


RERANKERS = {FuzzyReranker.name: FuzzyReranker, SentenceTransformerReranker.name: SentenceTransformerReranker}


def make_reranker(name):
    try:
        factory = RERANKERS[name]
    except KeyError:
        raise UnknownEmbedder(name, sorted(RERANKERS), kind='reranker') from None
    return factory()


def rerank(reranker, queries, candidates):
    """Score candidates against their query.

    `queries[i]` is a string and `candidates[i]` a list of candidates for it, each a non-empty list of
    texts. Returns, in the same nesting, one `Reranked` per candidate.
    """
    left, right, owners = [], [], []
    for qi, (query, group) in enumerate(zip(queries, candidates)):
        for ci, texts in enumerate(group):
            for ti, text in enumerate(texts):
                left.append(query)
                right.append(text)
                owners.append((qi, ci, ti))
    scores = reranker.score_pairs(left, right) if left else []
    results = [[Reranked(-1.0, 0) for _ in group] for group in candidates]
    for (qi, ci, ti), score in zip(owners, scores):
        score = float(score)
        if score > results[qi][ci].score:  # strict: on a tie the earlier text (the name) keeps the match
            results[qi][ci] = Reranked(score, ti)
    return results
