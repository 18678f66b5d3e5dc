"""`run_match` and `run_rerank` over the tiny terminology loaded in the database, in OCL's wire format."""
import pytest
from rest_framework.exceptions import ValidationError

from concepts.services import chunks, run_match, run_rerank, validate_match

URL = '/orgs/HL/sources/TinyClinical/'


def matched(body, semantic=False, reranker=False, **query):
    return run_match(validate_match(body, {key: str(value) for key, value in query.items()}), semantic, reranker)


def ids(answer):
    return [[concept['id'] for concept in entry['results']] for entry in answer]


@pytest.mark.django_db
def test_a_lexical_match_answers_one_entry_per_row_in_order_with_the_row_as_sent(tiny_source):
    rows = [{'name': 'heart attack', 'id': 'r1', 'extra': [1]}, {'name': 'acetaminophen'}, {'name': 'zzz'}]
    answer = matched({'rows': rows, 'target_repo_url': URL, 'map_config': [{'input': 'name'}],
                      'filter': {'locale': 'en'}}, limit=2)
    assert [entry['row'] for entry in answer] == rows
    assert all(entry['map_config'] == [{'input': 'name'}] and entry['filter'] == {'locale': 'en'}
               for entry in answer)
    assert ids(answer) == [['TC005', 'TC006'], ['TC033'], []]
    first = answer[0]['results'][0]
    assert first == {
        'id': 'TC005', 'type': 'Concept', 'url': '/orgs/HL/sources/TinyClinical/concepts/TC005/',
        'version_url': '/orgs/HL/sources/TinyClinical/1/concepts/TC005/', 'retired': False,
        'display_name': 'Myocardial infarction', 'search_meta': {
            'search_score': first['search_meta']['search_score'], 'search_rerank_score': None,
            'search_confidence': '', 'search_highlight': {'synonyms': ['<em>Heart</em> <em>attack</em>']},
            'match_type': 'very_high', 'search_normalized_score': 100.0, 'algorithm': 'ocl-search'}}
    second = answer[0]['results'][1]['search_meta']
    assert first['search_meta']['search_score'] > second['search_score'] > 0


@pytest.mark.django_db
def test_the_default_limit_is_ocls_one_and_limit_offset_and_page_page_through_the_candidates(tiny_source):
    body = {'rows': [{'name': 'pain'}], 'target_repo_url': URL}
    assert len(ids(matched(body, semantic=True))[0]) == 1
    five = ids(matched(body, semantic=True, limit=5))[0]
    assert len(five) == 5
    assert ids(matched(body, semantic=True, limit=2, offset=1))[0] == five[1:3]
    assert ids(matched(body, semantic=True, limit=2, page=2))[0] == five[2:4]
    assert len(ids(matched({**body, 'limit': 3}, semantic=True))[0]) == 3  # a body limit, when the query has none
    assert len(ids(matched({**body, 'limit': 3}, semantic=True, limit=4))[0]) == 4


@pytest.mark.django_db
def test_verbose_adds_the_concept_details_and_best_match_keeps_medium_and_better(tiny_source):
    body = {'rows': [{'name': 'heart attack'}], 'target_repo_url': URL}
    concept = matched(body, limit=3, verbose='true')[0]['results'][0]
    assert concept['concept_class'] == 'Disorder' and concept['owner'] == 'HL'
    assert concept['source'] == 'TinyClinical' and concept['version'] == '1'
    assert concept['names'][0] == {'name': 'Myocardial infarction', 'locale': 'en', 'locale_preferred': True,
                                   'name_type': 'Fully Specified'}
    assert {'name': 'Heart attack', 'locale': 'en', 'locale_preferred': False,
            'name_type': 'Synonym'} in concept['names']
    everything = matched(body, semantic=True, limit=10)[0]['results']
    best = matched(body, semantic=True, limit=10, bestMatch='true')[0]['results']
    assert {c['search_meta']['match_type'] for c in best} <= {'medium', 'high', 'very_high'}
    assert [c['id'] for c in best] == [c['id'] for c in everything
                                       if c['search_meta']['match_type'] != 'low']
    assert len(best) < len(everything)


@pytest.mark.django_db
def test_a_semantic_match_with_the_character_embedder_finds_misspelt_rows(tiny_source, settings):
    # The default MiniLM finds the last two but not 'hypertenison' (docs/quality.md): typos are tfidf-svd's.
    settings.CONCEPTS_EMBEDDER = 'tfidf-svd'
    rows = [{'name': 'hypertenison'}, {'name': 'diarhea'}, {'name': 'ostoeporosis'}]
    answer = matched({'rows': rows, 'target_repo_url': URL}, semantic=True, limit=5)
    assert [row[0] for row in ids(answer)] == ['TC001', 'TC018', 'TC028']
    metas = [c['search_meta'] for entry in answer for c in entry['results']]
    assert {meta['algorithm'] for meta in metas} == {'ocl-semantic'}
    assert all(-1.0 <= meta['search_score'] <= 1.0 and 0 <= meta['search_normalized_score'] <= 100
               for meta in metas)


@pytest.mark.django_db
def test_a_reranked_match_puts_the_closest_name_first_and_scores_in_zero_to_one(tiny_source):
    body = {'rows': [{'name': 'head ache'}], 'target_repo_url': URL}
    assert ids(matched(body, limit=3))[0][0] == 'TC020'
    answer = matched(body, reranker=True, limit=3)
    first = answer[0]['results'][0]
    assert first['id'] == 'TC011' and first['display_name'] == 'Headache'
    scores = [c['search_meta']['search_rerank_score'] for c in answer[0]['results']]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert [c['search_meta']['search_score'] for c in answer[0]['results']] == scores


@pytest.mark.django_db
def test_a_semantic_reranked_match(tiny_source):
    answer = matched({'rows': [{'name': 'renal failure'}], 'target_repo_url': URL}, True, True, limit=2)
    assert set(ids(answer)[0]) == {'TC038', 'TC039'}
    assert {c['search_meta']['algorithm'] for c in answer[0]['results']} == {'ocl-semantic'}


@pytest.mark.django_db
def test_the_same_body_gives_the_same_answer_every_time(tiny_source):
    names = ('renal failure', 'diabetes', 'blood', 'pain')
    body = {'rows': [{'name': n} for n in names], 'target_repo_url': URL}
    for semantic in (False, True):
        for reranker in (False, True):
            first = matched(body, semantic, reranker, limit=5)
            assert matched(body, semantic, reranker, limit=5) == first


@pytest.mark.django_db
def test_ocls_target_repo_object_stands_in_for_the_url(tiny_source):
    repo = {'owner': 'HL', 'owner_type': 'Organization', 'source': 'TinyClinical', 'source_version': '1'}
    payload = validate_match({'rows': [{'name': 'flu'}], 'target_repo': repo}, {})
    assert payload['body']['target_repo_url'] == URL
    with pytest.raises(ValidationError) as caught:
        validate_match({'rows': [{'name': 'flu'}], 'target_repo': {**repo, 'source_version': '9'}}, {})
    assert list(caught.value.detail) == ['target_repo_url']


@pytest.mark.django_db
def test_the_embedder_comes_from_settings_and_an_unknown_one_is_named(tiny_source, settings):
    from concepts.errors import UnknownEmbedder
    settings.CONCEPTS_EMBEDDER = 'word2vec'
    with pytest.raises(UnknownEmbedder, match="unknown embedder 'word2vec'"):
        matched({'rows': [{'name': 'flu'}], 'target_repo_url': URL}, semantic=True)


@pytest.mark.django_db
def test_run_match_validates_its_payload(tiny_source):
    payload = validate_match({'rows': [{'name': 'flu'}], 'target_repo_url': URL}, {})
    with pytest.raises(ValidationError):
        run_match({**payload, 'body': {**payload['body'], 'target_repo_url': '/orgs/HL/sources/Gone/'}},
                  False, False)
    with pytest.raises(ValidationError) as caught:
        run_match({**payload, 'params': {**payload['params'], 'limit': 0}}, False, False)
    assert list(caught.value.detail) == ['limit']


@pytest.mark.django_db
def test_a_source_deleted_after_the_view_validated_is_refused_when_the_match_runs(tiny_source):
    payload = validate_match({'rows': [{'name': 'flu'}], 'target_repo_url': URL}, {})
    tiny_source.delete()
    with pytest.raises(ValidationError) as caught:
        run_match(payload, semantic=False, reranker=False)
    assert list(caught.value.detail) == ['target_repo_url']


def test_rerank_answers_ocls_list_best_first_with_the_score_where_ocl_puts_it():
    rows = [{'display_name': 'Fever', 'id': 1},
            {'display_name': 'Diabetes mellitus type 1', 'id': 2},
            {'display_name': 'Type 2 diabetes', 'id': 3, 'search_meta': {'search_score': 4.0}}]
    answer = run_rerank({'q': 'diabetes type 2', 'rows': rows})
    assert [row['id'] for row in answer] == [3, 2, 1]
    score = answer[0]['search_meta']['search_rerank_score']
    assert score > 0.9  # the same words in another order: the sentence model's cosine, not quite 1
    assert answer[0] == {**rows[2], 'search_meta': {'search_score': 4.0, 'search_rerank_score': score,
                                         'search_normalized_score': round(score * 100, 4)}}
    assert answer[1]['search_rerank_score'] == answer[1]['search_meta']['search_normalized_score'] / 100
    assert 1.0 > answer[1]['search_rerank_score'] > answer[2]['search_rerank_score'] >= 0.0


def test_rerank_reads_name_key_and_writes_score_key_and_sorts_rows_without_text_last():
    rows = [{'label': {'text': 'cough'}, 'id': 0}, {'id': 1}, {'label': {'text': 'Chronic cough'}, 'id': 2}]
    answer = run_rerank({'q': 'cough', 'rows': rows, 'name_key': 'label.text', 'score_key': 'fit'})
    assert [row['id'] for row in answer] == [0, 2, 1]
    assert answer[0]['fit'] == 1.0 and answer[2]['fit'] == -1000000.0


def test_rerank_keeps_input_order_for_equal_scores():
    rows = [{'display_name': 'Cough', 'id': i} for i in range(5)]
    assert [row['id'] for row in run_rerank({'q': 'cough', 'rows': rows})] == [0, 1, 2, 3, 4]


@pytest.mark.django_db
@pytest.mark.parametrize('semantic, reranker', [(True, True), (False, True), (True, False)])
def test_reporting_progress_a_chunk_at_a_time_changes_no_answer(tiny_source, semantic, reranker):
    rows = [{'name': name} for name in ('heart attack', 'high blood pressure', 'fever', 'sugar diabetes',
                                        'acetaminophen', 'chest pain', 'zzz')] * 30  # 210 rows: chunks of 64
    payload = validate_match({'rows': rows, 'target_repo_url': URL}, {'limit': '5'})
    reports = []
    chunked = run_match(payload, semantic, reranker, progress=lambda done, total: reports.append((done, total)))
    assert chunked == run_match(payload, semantic, reranker)
    assert reports == [(64, 210), (128, 210), (192, 210), (210, 210)]
    body = {'q': 'heart attack', 'name_key': 'name',
            'rows': [{'name': row['name'], 'n': i} for i, row in enumerate(rows)]}
    reports.clear()
    assert run_rerank(body, progress=lambda done, total: reports.append(done)) == run_rerank(body)
    assert reports == [64, 128, 192, 210]


@pytest.mark.parametrize('total, expected', [
    (1, [(0, 1)]), (20, [(0, 20)]), (64, [(0, 64)]), (65, [(0, 64), (64, 65)]),
    (1000, [(k * 100, k * 100 + 100) for k in range(10)]),  # tenths once a tenth is over 64 rows
])
def test_a_run_reports_progress_in_tenths_of_no_fewer_than_64_rows(total, expected):
    assert chunks(total) == expected
