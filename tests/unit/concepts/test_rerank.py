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


def test_a_definition_adds_a_tenth_of_its_score_and_never_becomes_the_match():
    class Fixed:
        definition_weight = 0.1

        def score_pairs(self, left, right):
            return np.array([{'name': 0.5, 'synonym': 0.6, 'definition': 0.9}[text] for text in right])

    [[defined, plain]] = rerank(Fixed(), ['q'], [[['name', 'synonym'], ['name']]], [['definition', '']])
    assert defined.matched == 1 and defined.score == pytest.approx((0.9 + 0.1 * 0.9) / 1.1)
    assert plain.matched == 0 and plain.score == pytest.approx(0.5)


def test_the_default_reranker_is_the_semantic_one_and_reads_the_index_it_is_given(tiny_minilm):
    reranker = make_reranker('semantic', index=tiny_minilm)
    assert isinstance(reranker, SemanticReranker) and reranker.index is tiny_minilm
    assert isinstance(make_reranker('fuzzy', index=tiny_minilm), FuzzyReranker)
