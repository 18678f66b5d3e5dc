"""OCL's wire format for `$match` and `$rerank`: how a candidate concept, its `search_meta` and a reranked row
look, so a client written for OpenConceptLab's in-request endpoints (the OCL Mapper, scripts) reads these
answers unchanged. docs/api.md describes the format and what of OCL's is not supported here.

A concept is rendered as OCL's `ConceptMinimalSerializer` renders it in a `$match` answer (`id`, `type`,
`url`, `version_url`, `retired`, `display_name`, `search_meta`), or with `verbose` as the detail serializer
does, limited to what a loaded terminology knows (class, names, owner, source, version).

Scores. `search_score` is the retrieval's own score (BM25, cosine, or the reranker's when reranked), and
`search_rerank_score` the reranker's (null when not reranked). `search_normalized_score` is in 0..100, as
OCL's: the share of the row's words found in the matched name or synonym (lexical), or the cosine or
reranker score x 100. `match_type` follows OCL's thresholds on the normalized score (very_high >= 90,
high >= 65, medium >= 50, else low), and is `very_high` for every candidate when `limit` is 1, as OCL does.
"""
import re
from urllib.parse import quote

from concepts.matching.text import tokens

MATCH_TYPES = ((0.9, 'very_high'), (0.65, 'high'), (0.5, 'medium'))
BEST_MATCH_TYPES = ('medium', 'high', 'very_high')  # what `bestMatch` keeps, as OCL does
RERANK_SCORE_KEY = 'search_rerank_score'
RERANK_NAME_KEY = 'display_name'
MISSING_SCORE = -1000000.0  # a $rerank row without text to score sorts last, as in OCL
_WORD = re.compile(r'[0-9A-Za-z\u00C0-\uFFFF]+')


def algorithm_name(semantic):
    return 'ocl-semantic' if semantic else 'ocl-search'


def coverage(query, text):
    """The share (0..1) of the words of `query` that `text` has (normalized and stemmed)."""
    wanted = set(tokens(query))
    return len(wanted & set(tokens(text))) / len(wanted) if wanted else 0.0


def highlight(query, text):
    """`text` with each word of `query` in it wrapped in <em>, as Elasticsearch highlights; None when
    none is."""
    wanted = set(tokens(query))
    found = False

    def mark(word):
        nonlocal found
        if set(tokens(word.group(0))) & wanted:
            found = True
            return f'<em>{word.group(0)}</em>'
        return word.group(0)
    marked = _WORD.sub(mark, text)
    return marked if found else None


def fully_highlighted(text):
    """`text` with every word in it wrapped in <em>: the longest highlight it can get (concepts.bounds)."""
    return _WORD.sub(lambda word: f'<em>{word.group(0)}</em>', text)


def match_type(normalized, limit):
    if limit <= 1:
        return 'very_high'
    for threshold, name in MATCH_TYPES:
        if normalized >= threshold:
            return name
    return 'low'


def normalized_score(query, matched, score, semantic, reranked):
    """0..1: see the module docstring."""
    if reranked or semantic:
        return min(max(float(score), 0.0), 1.0)
    return coverage(query, matched)


def concept_urls(source, code):
    base = f'/orgs/{quote(source.org)}/sources/{quote(source.mnemonic)}/'
    path = f'concepts/{quote(code, safe=":")}/'
    return base + path, f'{base}{quote(source.version)}/{path}'


def concept(source, code, name, concept_class, texts, search_meta, verbose):
    """One candidate as OCL renders it; `texts` are its name then its synonyms."""
    url, version_url = concept_urls(source, code)
    body = {'id': code, 'type': 'Concept', 'url': url, 'version_url': version_url, 'retired': False,
            'display_name': name}
    if verbose:
        body.update({
            'concept_class': concept_class, 'datatype': 'N/A', 'display_locale': 'en',
            'names': [{'name': text, 'locale': 'en', 'locale_preferred': index == 0,
                       'name_type': 'Fully Specified' if index == 0 else 'Synonym'}
                      for index, text in enumerate(texts)],
            'source': source.mnemonic, 'owner': source.org, 'owner_type': 'Organization',
            'owner_url': f'/orgs/{quote(source.org)}/', 'version': source.version, 'extras': {}})
    body['search_meta'] = search_meta
    return body


def search_meta(query, name, matched, score, semantic, reranked, limit):
    normalized = normalized_score(query, matched, score, semantic, reranked)
    marks = {}
    if (named := highlight(query, name)) is not None:
        marks['name'] = [named]
    if matched != name and (synonym := highlight(query, matched)) is not None:
        marks['synonyms'] = [synonym]
    return {'search_score': score, 'search_rerank_score': score if reranked else None,
            'search_confidence': '', 'search_highlight': marks, 'match_type': match_type(normalized, limit),
            'search_normalized_score': round(normalized * 100, 4), 'algorithm': algorithm_name(semantic)}


def path_get(row, path):
    """The value at the dotted `path` of `row` (OCL reads `name_key` so), or None."""
    value = row
    for part in path.split('.'):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def scored_row(row, score_key, score):
    """A $rerank row with its score set, as OCL sets it: under `search_meta` when the row has one, else at
    the top level; `search_meta.search_normalized_score` is the score x 100 either way."""
    row = dict(row)
    meta = dict(row['search_meta']) if isinstance(row.get('search_meta'), dict) else None
    if meta is not None:
        meta[score_key] = score
    else:
        row[score_key] = score
        meta = {}
    meta['search_normalized_score'] = score * 100
    row['search_meta'] = meta
    return row

