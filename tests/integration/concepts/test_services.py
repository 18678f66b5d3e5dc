"""`run_match` and `run_rerank` over the tiny terminology loaded in the database."""
import pytest
from rest_framework.exceptions import ValidationError

from concepts.services import run_match, run_rerank, validate_match_body

URL = '/orgs/HL/sources/TinyClinical/'


def codes(result):
    return [[candidate['code'] for candidate in row['candidates']] for row in result['results']]


@pytest.mark.django_db
def test_a_lexical_match_returns_one_result_per_row_in_order_with_the_row_echoed(tiny_source):
    rows = [{'name': 'heart attack', 'id': 'r1', 'extra': [1]}, {'name': 'acetaminophen'}, {'name': 'zzz'}]
    result = run_match({'rows': rows, 'target_repo_url': URL, 'limit': 2}, semantic=False, reranker=False)
    assert result['source'] == URL and result['source_version'] == '1' and result['algorithm'] == 'bm25'
    assert [row['row'] for row in result['results']] == rows
    assert codes(result) == [['TC005', 'TC006'], ['TC033'], []]
    assert result['results'][0]['candidates'][0] == {
        'code': 'TC005', 'name': 'Myocardial infarction', 'concept_class': 'Disorder',
        'score': result['results'][0]['candidates'][0]['score'], 'matched': 'Heart attack'}
    assert result['results'][0]['candidates'][0]['score'] > result['results'][0]['candidates'][1]['score'] > 0


@pytest.mark.django_db
def test_a_semantic_match_finds_misspelt_rows(tiny_source):
    rows = [{'name': 'hypertenison'}, {'name': 'diarhea'}, {'name': 'ostoeporosis'}]
    body = {'rows': rows, 'target_repo_url': URL}
    result = run_match(body, semantic=True, reranker=False)
    assert result['algorithm'] == 'semantic:tfidf-svd'
    assert [row[0] for row in codes(result)] == ['TC001', 'TC018', 'TC028']
    assert all(len(row) == 5 for row in codes(result))  # the default limit
    assert all(-1.0 <= c['score'] <= 1.0 for row in result['results'] for c in row['candidates'])


@pytest.mark.django_db
def test_a_reranked_match_puts_the_closest_name_first_and_scores_in_zero_to_one(tiny_source):
    body = {'rows': [{'name': 'head ache'}], 'target_repo_url': URL, 'limit': 3}
    assert codes(run_match(body, semantic=False, reranker=False))[0][0] == 'TC020'
    result = run_match(body, semantic=False, reranker=True)
    assert result['algorithm'] == 'bm25+rerank:fuzzy'
    first = result['results'][0]['candidates'][0]
    assert (first['code'], first['matched']) == ('TC011', 'Headache')
    scores = [c['score'] for c in result['results'][0]['candidates']]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)


@pytest.mark.django_db
def test_a_semantic_reranked_match_names_both_steps(tiny_source):
    result = run_match({'rows': [{'name': 'renal failure'}], 'target_repo_url': URL, 'limit': 2},
                       semantic=True, reranker=True)
    assert result['algorithm'] == 'semantic:tfidf-svd+rerank:fuzzy'
    assert set(codes(result)[0]) == {'TC038', 'TC039'}


@pytest.mark.django_db
def test_the_same_body_gives_the_same_result_every_time(tiny_source):
    names = ('renal failure', 'diabetes', 'blood', 'pain')
    body = {'rows': [{'name': n} for n in names], 'target_repo_url': URL}
    for semantic in (False, True):
        for reranker in (False, True):
            first = run_match(body, semantic, reranker)
            assert run_match(body, semantic, reranker) == first


@pytest.mark.django_db
def test_the_embedder_comes_from_settings_and_an_unknown_one_is_named(tiny_source, settings):
    from concepts.errors import UnknownEmbedder
    settings.CONCEPTS_EMBEDDER = 'word2vec'
    with pytest.raises(UnknownEmbedder, match="unknown embedder 'word2vec'"):
        run_match({'rows': [{'name': 'flu'}], 'target_repo_url': URL}, semantic=True, reranker=False)


@pytest.mark.django_db
def test_run_match_validates_its_body(tiny_source):
    with pytest.raises(ValidationError):
        run_match({'rows': [{'name': 'flu'}], 'target_repo_url': '/orgs/HL/sources/Gone/'}, False, False)


@pytest.mark.django_db
def test_a_source_deleted_after_the_view_validated_is_refused_when_the_match_runs(tiny_source):
    body = validate_match_body({'rows': [{'name': 'flu'}], 'target_repo_url': URL})
    tiny_source.delete()
    with pytest.raises(ValidationError) as caught:
        run_match(body, semantic=False, reranker=False)
    assert list(caught.value.detail) == ['target_repo_url']


def test_rerank_sorts_rows_by_score_and_adds_the_score():
    body = {'q': 'diabetes type 2', 'rows': [
        {'name': 'Fever', 'id': 1},
        {'name': 'Diabetes mellitus type 1', 'id': 2},
        {'name': 'Non-insulin-dependent diabetes', 'synonyms': ['Type 2 diabetes'], 'id': 3}]}
    result = run_rerank(body)
    assert result['q'] == 'diabetes type 2' and result['algorithm'] == 'rerank:fuzzy'
    assert [row['id'] for row in result['rows']] == [3, 2, 1]
    assert result['rows'][0] == {**body['rows'][2], 'score': 1.0}
    assert 1.0 > result['rows'][1]['score'] > result['rows'][2]['score'] >= 0.0


def test_rerank_keeps_input_order_for_equal_scores():
    rows = [{'name': 'Cough', 'id': i} for i in range(5)]
    assert [row['id'] for row in run_rerank({'q': 'cough', 'rows': rows})['rows']] == [0, 1, 2, 3, 4]
