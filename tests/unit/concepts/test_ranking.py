import numpy as np

from concepts.matching.ranking import top_k


def test_the_best_scores_come_first():
    assert top_k(np.array([0.1, 0.9, 0.5, 0.7]), 3).tolist() == [1, 3, 2]


def test_equal_scores_are_ordered_by_lower_index_even_across_the_cut():
    scores = np.array([0.5, 0.9, 0.5, 0.5, 0.5])
    assert top_k(scores, 3).tolist() == [1, 0, 2]


def test_scores_equal_at_six_decimals_count_as_ties_and_others_do_not():
    assert top_k(np.array([0.7000001, 0.7000004]), 2).tolist() == [0, 1]
    assert top_k(np.array([0.700001, 0.700004]), 2).tolist() == [1, 0]


def test_scores_under_the_minimum_are_never_returned():
    assert top_k(np.array([0.0, 2.0, 0.0, 1.0]), 5, min_score=0.0001).tolist() == [1, 3]


def test_asking_for_more_than_there_are_returns_them_all():
    assert top_k(np.array([0.2, 0.1]), 10).tolist() == [0, 1]
