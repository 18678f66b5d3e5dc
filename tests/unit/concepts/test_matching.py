"""Lexical, semantic and reranked matching over the tiny terminology (no database)."""
import numpy as np

from concepts.matching.embedders import make_embedder
from concepts.matching.index import SemanticIndex
from concepts.matching.pipeline import match
from concepts.matching.rerank import FuzzyReranker, SemanticReranker
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


def test_the_default_embedder_matches_meaning_not_spelling(tiny_minilm):
    assert found(tiny_minilm, 'myocardial infarct')[0][0] == 'TC005'
    assert found(tiny_minilm, 'elevated temperature')[0][0] == 'TC013'
    assert match(tiny_minilm, ['Brain attack'], 1)[0][0].score == 1.0  # an exact synonym


DEFINED = [ConceptRow('C1', 'Pyrexia', 'X', ('Febrile',), 'Body temperature above the normal range.'),
           ConceptRow('C2', 'Hypothermia', 'X', (), 'Body temperature below the normal range.'),
           ConceptRow('C3', 'Tachycardia', 'X', ('Fast heart rate',))]


def test_a_definition_finds_its_concept_and_a_name_is_what_matched(tmp_path):
    index = SemanticIndex.build(ConceptTable.build(DEFINED), make_embedder('minilm'))
    assert index.definition_owner.tolist() == [0, 1]
    hits = match(index, ['body temperature below the normal range'], 2)[0]
    assert index.table.codes[hits[0].concept] == 'C2' and hits[0].score > 0.9
    assert index.table.texts[hits[0].entry] == 'Hypothermia'  # a definition is never shown as a name
    index.save(tmp_path)
    loaded = SemanticIndex.load(tmp_path, make_embedder('minilm'))
    queries = ['body temperature below the normal range', 'fever']
    # The same order and entries; scores to float32 rounding (a text's batch-mates change its last bits).
    for again, first in zip(match(loaded, queries, 3), match(index, queries, 3)):
        assert [(hit.concept, hit.entry) for hit in again] == [(hit.concept, hit.entry) for hit in first]
        np.testing.assert_allclose([hit.score for hit in again], [hit.score for hit in first], atol=1e-5)


def test_the_semantic_reranker_fixes_a_lexical_ranking_from_the_source_vectors(tiny_lexical, tiny_minilm):
    reranker = SemanticReranker(tiny_minilm)
    assert found(tiny_lexical, 'head ache')[0][0] == 'TC020'  # 'Stomach ache' shares the rarer word
    assert found(tiny_lexical, 'head ache', limit=1, reranker=reranker)[0][0] == 'TC011'
    assert found(tiny_lexical, 'heart attack', limit=1, reranker=reranker)[0][0] == 'TC005'


def test_the_semantic_reranker_keeps_the_semantic_ranking_and_scores_in_zero_to_one(tiny_minilm):
    queries = ['myocardial infarct', 'elevated temperature', 'sugar in the blood', 'broken bone']
    reranked = match(tiny_minilm, queries, 3, SemanticReranker(tiny_minilm))
    retrieved = match(tiny_minilm, queries, 3)
    assert [row[0].concept for row in reranked] == [row[0].concept for row in retrieved]
    assert all(0.0 <= hit.score <= 1.0 for row in reranked for hit in row)
