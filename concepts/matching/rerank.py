"""Rerankers: a finer, slower similarity than retrieval, for a query against a handful of candidates.

A candidate is a list of texts (its name, then its synonyms) and, optionally, its definition; the text
that scored it best is what matched (never the definition). Rerankers are selected by name (setting
``CONCEPTS_RERANKER``):

- ``semantic`` (default): the sentence model's vectors, adapted to the source when the source's semantic
  index is given (a `$match`; `SemanticReranker`). A candidate's score is the mean of two cosines with the
  query: its best text's (a definition counts as a text here), which is what retrieval ranks by, and its
  *centroid*'s, the mean vector of all its texts and its definition. The centroid is the evidence retrieval
  does not use: a concept whose texts agree about the query is likelier right than one with a single
  near text. On the held-out HPO synonyms it lifts both the BM25 and the semantic retrieval at recall@1
  (docs/quality.md). A candidate of one text and no definition (a `$rerank` row) scores its cosine.
- ``fuzzy`` (no model): ``0.2 * token Dice + 0.4 * character 3-gram cosine + 0.4 * edit similarity`` on
  normalized text, where the token Dice uses stemmed word sets, and the edit similarity is the better of
  normalized Levenshtein similarity and rapidfuzz's token-sort ratio (word order does not matter). All
  three are in [0, 1], so the score is too; identical normalized texts score 1. A candidate scores its
  best text; definitions are not read. Character similarity was measured to lower the recall@1 of the
  sentence model's rankings, so it has no part in the semantic reranker.

Every pair of a batch is scored in one pass: the n-gram cosine is one sparse product, the cosines one
product of vectors each embedded (or read from the index) once.
"""
from dataclasses import dataclass

import numpy as np

from concepts.errors import UnknownEmbedder
from concepts.matching.text import normalize, stem

# Chosen on a held-out split with another seed (99) than the one docs/quality.md reports (13).
TOKEN_WEIGHT, CHAR_WEIGHT, EDIT_WEIGHT = 0.2, 0.4, 0.4
# The centroid's cosine against the best text's: on the seed-99 split (all 2,245 held-out synonyms) any
# weight from 0.7 to 3 gave recall@1 0.669 to 0.674 over the semantic retrieval's 0.643; 1 is the mean.
CENTROID_WEIGHT = 1.0
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
    """Cosines of sentence vectors (all-MiniLM-L6-v2, concepts.matching.minilm), scores clipped to [0, 1].

    With a source's `index` (a SemanticIndex), a text that is one of its entries or definitions is read
    with its stored vector, already adapted to the source, and any other text (the query) is embedded by
    the index's own embedder (model + adapter): a `$match` then runs the model on its rows only, and a
    candidate's centroid is a sum of stored vectors. Without one (a `$rerank`, which names no source),
    every text is embedded by the model alone.
    """

    name = 'semantic'
    centroid_weight = CENTROID_WEIGHT

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

    def score_candidates(self, queries, candidates, definitions=None):
        """`rerank`'s answer: (max(best text, definition) + w * centroid) / (1 + w), w `centroid_weight`,
        where each term is a cosine with the query and the centroid is the normalized mean of the
        candidate's text and definition vectors."""
        strings = _Strings(normalized=False)
        query_of, members, starts, names = [], [], [], []
        for qi, (query, group) in enumerate(zip(queries, candidates)):
            q = strings.add(query)
            for ci, texts in enumerate(group):
                definition = definitions[qi][ci] if definitions is not None else ''
                starts.append(len(members))
                names.append(len(texts))
                members.extend(strings.add(text) for text in texts)
                if definition:
                    members.append(strings.add(definition))
                query_of.append(q)
        results = [[] for _ in candidates]
        if not members:
            return results
        vectors = self._vectors(strings.values)
        query_of, members, starts = np.asarray(query_of), np.asarray(members), np.asarray(starts)
        member_query = np.repeat(query_of, np.diff(np.append(starts, len(members))))
        cosines = np.einsum('ij,ij->i', vectors[members], vectors[member_query])
        centroids = np.add.reduceat(vectors[members], starts, axis=0)
        centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        central = np.einsum('ij,ij->i', centroids, vectors[query_of]).tolist()
        weight = self.centroid_weight
        candidate = 0
        for qi, group in enumerate(candidates):
            for _ in group:
                start, count = int(starts[candidate]), names[candidate]
                own = cosines[start:start + count]
                matched = int(np.argmax(own))  # the first best: on a tie the name keeps the match
                end = starts[candidate + 1] if candidate + 1 < len(starts) else len(members)
                best = float(cosines[start:end].max())  # the definition's counts, though it never matches
                score = (best + weight * central[candidate]) / (1 + weight)
                results[qi].append(Reranked(min(max(score, 0.0), 1.0), matched))
                candidate += 1
        return results

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
    nesting, one `Reranked` per candidate. A reranker that scores whole candidates (`score_candidates`, the
    semantic one) is asked for them; any other scores each text, and a candidate scores its best text (a
    definition is never what matched).
    """
    score_candidates = getattr(reranker, 'score_candidates', None)
    if score_candidates is not None:
        return score_candidates(queries, candidates, definitions)
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
