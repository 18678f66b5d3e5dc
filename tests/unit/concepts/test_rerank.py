import numpy as np
import pytest

from concepts.errors import UnknownEmbedder
from concepts.matching.rerank import FuzzyReranker, make_reranker, rerank


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
