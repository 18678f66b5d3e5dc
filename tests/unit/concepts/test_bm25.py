import numpy as np

from concepts.matching.bm25 import BM25

TEXTS = ['renal cyst', 'renal failure', 'renal agenesis', 'hepatic cyst', 'short stature']


def test_a_rare_shared_word_outweighs_a_common_one():
    scores = BM25.fit(TEXTS).scores(['renal cyst'])[0]
    # 'cyst' is in 2 texts, 'renal' in 3: the hepatic cyst beats the other renal findings.
    assert scores[0] > scores[3] > scores[1] == scores[2]


def test_a_text_sharing_no_word_scores_zero_and_unknown_words_are_ignored():
    scores = BM25.fit(TEXTS).scores(['stature zzzunknown', 'nothing known here'])
    assert scores[0].nonzero()[0].tolist() == [4]
    assert not scores[1].any()


def test_plural_queries_match_singular_texts():
    assert BM25.fit(TEXTS).scores(['cysts'])[0][0] > 0


def test_a_saved_index_loads_with_the_same_scores(tmp_path):
    index = BM25.fit(TEXTS)
    index.save(tmp_path)
    loaded = BM25.load(tmp_path)
    queries = ['renal cyst', 'short', 'failure of the kidney']
    np.testing.assert_array_equal(loaded.scores(queries), index.scores(queries))
