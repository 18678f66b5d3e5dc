import numpy as np
import pytest

from concepts.errors import UnknownEmbedder
from concepts.matching.rerank import FuzzyReranker, SemanticReranker, make_reranker, rerank


def test_identical_text_scores_one_whatever_its_case_and_punctuation():
    scores = FuzzyReranker().score_pairs(['Heart attack', 'heart-attack'], ['HEART ATTACK', 'Heart attack!'])
    np.testing.assert_allclose(scores, [1.0, 1.0])


def test_scores_stay_between_zero_and_one_and_closer_text_scores_higher():
    scores = FuzzyReranker().score_pairs(['renal cyst'] * 3, ['Renal cysts', 'Kidney cyst', 'Short stature'])
    assert 1.0 >= scores[0] > scores[1] > scores[2] >= 0.0


def test_word_order_matters_little():
    near, far = FuzzyReranker().score_pairs(['kidney disease chronic'] * 2,
                                            ['Chronic kidney disease', 'Chronic lung disease'])
    assert near > 0.8 > far


def test_a_candidate_scores_its_best_text_and_names_it():
    [[first, second]] = rerank(FuzzyReranker(), ['stomach ache'],
                               [[['Abdominal pain', 'Stomach ache', 'Belly pain'], ['Headache']]])
    assert first.matched == 1 and first.score == pytest.approx(1.0)
    assert second.matched == 0 and second.score < first.score


def test_an_unknown_reranker_is_refused_by_name():
    with pytest.raises(UnknownEmbedder, match="unknown reranker 'magic'"):
        make_reranker('magic')


def test_the_semantic_reranker_without_a_source_embeds_the_texts_it_is_given():
    near, far = SemanticReranker().score_pairs(['stomach ache'] * 2, ['Abdominal pain', 'Headache'])
    assert 1.0 >= near > far >= 0.0


class _Stored:
    """A semantic index stand-in: fixed unit vectors for known texts, nothing to embed."""

    embedder = None

    def __init__(self, vectors):
        self.vectors = {text: np.asarray(vector, dtype=np.float32) / np.linalg.norm(vector)
                        for text, vector in vectors.items()}

    def stored_vectors(self, texts):
        return [self.vectors[text] for text in texts]


def test_a_concept_whose_texts_agree_outranks_one_with_a_single_nearer_text():
    index = _Stored({'q': [1, 0], 'near': [0.95, 0.312], 'off': [0, 1], 'up': [0.9, 0.436],
                     'down': [0.9, -0.436]})
    [[single, agreeing]] = SemanticReranker(index).score_candidates(['q'], [[['off', 'near'], ['up', 'down']]])
    assert single.matched == 1 and single.score == pytest.approx((0.95 + 0.586) / 2, abs=1e-3)
    assert agreeing.matched == 0 and agreeing.score == pytest.approx((0.9 + 1.0) / 2, abs=1e-3)
    assert agreeing.score > single.score


def test_a_definition_counts_as_a_text_but_is_never_the_match():
    index = _Stored({'q': [1, 0], 'name': [0.5, 0.866], 'definition': [0.9, 0.436]})
    [[defined, plain]] = rerank(SemanticReranker(index), ['q'], [[['name'], ['name']]], [['definition', '']])
    assert defined.matched == 0 and plain.matched == 0
    # best 0.9 (the definition's), centroid of the two at 0.732
    assert defined.score == pytest.approx((0.9 + 0.732) / 2, abs=1e-3)
    assert plain.score == pytest.approx(0.5, abs=1e-4)


def test_one_text_without_a_definition_scores_its_cosine():
    index = _Stored({'q': [1, 0], 'text': [0.6, 0.8]})
    [[only]] = rerank(SemanticReranker(index), ['q'], [[['text']]])
    assert only.score == pytest.approx(0.6, abs=1e-6)


def test_the_default_reranker_is_the_semantic_one_and_reads_the_index_it_is_given(tiny_minilm):
    reranker = make_reranker('semantic', index=tiny_minilm)
    assert isinstance(reranker, SemanticReranker) and reranker.index is tiny_minilm
    assert isinstance(make_reranker('fuzzy', index=tiny_minilm), FuzzyReranker)
