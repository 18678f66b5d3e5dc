"""Rerankers: a finer, slower similarity than retrieval, for a query against a handful of candidates.

A candidate is a list of texts (its name, then its synonyms); its score is the best score of any of its
texts against the query, and the text that scored it is what matched. Rerankers are selected by name
(setting ``CONCEPTS_RERANKER``):

- ``semantic`` (default): the cosine of the sentence model's vectors, adapted to the source when the
  source's semantic index is given (a `$match`), with the candidate's definition as extra evidence
  (`SemanticReranker`, `rerank`). On the held-out HPO synonyms it lifts BM25's candidates most and keeps
  the semantic retrieval's order (docs/quality.md): character similarity was measured to lower the
  recall@1 of the semantic retrieval, so it has no part here.
- ``fuzzy`` (no model): ``0.2 * token Dice + 0.4 * character 3-gram cosine + 0.4 * edit similarity`` on
  normalized text, where the token Dice uses stemmed word sets, and the edit similarity is the better of
  normalized Levenshtein similarity and rapidfuzz's token-sort ratio (word order does not matter). All
  three are in [0, 1], so the score is too; identical normalized texts score 1.

Every pair of a batch is scored in one pass: the n-gram cosine is one sparse product.
"""
from dataclasses import dataclass

import numpy as np

from concepts.errors import UnknownEmbedder
from concepts.matching.text import normalize, stem

# Chosen on a held-out split with another seed (99) than the one docs/quality.md reports (13).
TOKEN_WEIGHT, CHAR_WEIGHT, EDIT_WEIGHT = 0.2, 0.4, 0.4
DEFINITION_WEIGHT = 0.1
DEFAULT_RERANKER = 'semantic'


@dataclass(frozen=True)
class Reranked:
    """One candidate's rerank score and the index of its text that matched (0 = its name)."""
    score: float
    matched: int


class _Strings:
    """Unique (normalized) strings, so each is vectorized once per batch."""

    def __init__(self, normalized=True):
        self.index = {}
        self.normalized = normalized

    def add(self, text):
        return self.index.setdefault(normalize(text) if self.normalized else text, len(self.index))

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


class SemanticReranker:
    """Cosine of sentence vectors (all-MiniLM-L6-v2, concepts.matching.minilm), clipped to [0, 1].

    With a source's `index` (a SemanticIndex), a text that is one of its entries or definitions is scored
    with its stored vector, already adapted to the source, and any other text (the query) is embedded by the
    index's own embedder (model + adapter): a `$match` then runs the model on its rows only. Without one (a
    `$rerank`, which names no source), every text is embedded by the model alone.
    A candidate's definition, when it has one, counts as one of its texts and adds
    `DEFINITION_WEIGHT` of its cosine to the candidate's score (see `rerank`).
    """

    name = 'semantic'
    definition_weight = DEFINITION_WEIGHT

    def __init__(self, index=None):
        from concepts.matching.minilm import Encoder
        self.index = index
        self.embedder = index.embedder if index is not None else Encoder().check()

    def score_pairs(self, left, right):
        strings = _Strings(normalized=False)
        li = np.fromiter((strings.add(text) for text in left), dtype=np.int64, count=len(left))
        ri = np.fromiter((strings.add(text) for text in right), dtype=np.int64, count=len(right))
        if not len(li):
            return np.zeros(0)
        vectors = self._vectors(strings.values)
        return np.clip(np.einsum('ij,ij->i', vectors[li], vectors[ri]), 0.0, 1.0)

    def _vectors(self, texts):
        known = self.index.stored_vectors(texts) if self.index is not None else [None] * len(texts)
        missing = [i for i, vector in enumerate(known) if vector is None]
        embedded = self.embedder.embed([texts[i] for i in missing]) if missing else None
        vectors = np.empty((len(texts), embedded.shape[1] if embedded is not None else len(known[0])),
                           dtype=np.float32)
        for i, vector in enumerate(known):
            if vector is not None:
                vectors[i] = vector
        if missing:
            vectors[missing] = embedded
        return vectors


RERANKERS = {SemanticReranker.name: SemanticReranker, FuzzyReranker.name: FuzzyReranker}


def reranks_with_index(name):
    """Whether the reranker called `name` reads a source's semantic index (`make_reranker(index=...)`)."""
    return name == SemanticReranker.name


def make_reranker(name, index=None):
    """A reranker; `index` (a source's SemanticIndex) is used by those that read one, else ignored."""
    try:
        factory = RERANKERS[name]
    except KeyError:
        raise UnknownEmbedder(name, sorted(RERANKERS), kind='reranker') from None
    return factory(index) if reranks_with_index(name) else factory()


def rerank(reranker, queries, candidates, definitions=None):
    """Score candidates against their query.

    `queries[i]` is a string and `candidates[i]` a list of candidates for it, each a non-empty list of
    texts; `definitions[i][j]`, when given, is candidate j's definition ('' for none). Returns, in the same
    nesting, one `Reranked` per candidate. A reranker with a `definition_weight` w scores a candidate with a
    definition of score d as (max(best text, d) + w * d) / (1 + w): a definition is evidence, not a name,
    and is never what matched.
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
    weight = getattr(reranker, 'definition_weight', 0.0)
    if definitions is not None and weight:
        pairs = [(qi, ci, text) for qi, group in enumerate(definitions) for ci, text in enumerate(group) if text]
        scored = reranker.score_pairs([queries[qi] for qi, _, _ in pairs], [text for _, _, text in pairs])
        for (qi, ci, _), score in zip(pairs, scored):
            best = results[qi][ci]
            results[qi][ci] = Reranked((max(best.score, float(score)) + weight * float(score)) / (1 + weight),
                                       best.matched)
    return results
