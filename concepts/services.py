"""The matching domain's service functions: what the `$match` / `$rerank` views and tasks call.

Plain functions of JSON-ready values; nothing here knows about lanes, capacity or Celery.

``validate_match_body(data) -> dict``
    Check a `$match` body and return it cleaned: ``{"rows": [...], "target_repo_url": <canonical url>,
    "limit": int}``. Raises `rest_framework.exceptions.ValidationError` whose detail names each bad field
    (``rows``, ``target_repo_url``, ``limit``, or ``non_field_errors`` when the body is not an object).
    Needs the database (the source must be loaded). Cleaning is idempotent: a cleaned body validates to
    itself, so it can be stored, queued as JSON, and validated again by the worker.

``validate_rerank_body(data) -> dict``
    Check a `$rerank` body: ``{"q": str, "rows": [...]}``; each row needs a non-empty ``name`` and may
    carry ``synonyms`` (a list of strings) that are scored too. No database.

``run_match(body, semantic: bool, reranker: bool) -> dict``
    Validate, then match each row's ``name`` against the source::

        {"results": [{"row": <input row>, "candidates": [
             {"code", "name", "concept_class", "score": float, "matched": <the name or synonym that matched>},
             ...]}, ...],                      # one result per input row, in input order
         "source": "/orgs/<org>/sources/<mnemonic>/", "source_version": str,
         "algorithm": "bm25" | "semantic:<embedder>", plus "+rerank:<reranker>" when reranked}

    Candidates are best first, at most ``limit``; equal scores (at 6 decimals) are ordered by code.
    ``semantic=False`` retrieves with BM25 (scores unbounded, > 0: a candidate shares a word with the row);
    ``semantic=True`` by cosine similarity of embeddings (``CONCEPTS_EMBEDDER``; scores in [-1, 1]).
    ``reranker=True`` retrieves ``max(limit, pipeline.RERANK_DEPTH)`` (25) candidates, rescores them with
    the reranker (``CONCEPTS_RERANKER``; scores in [0, 1]) and keeps the best ``limit``.

``run_rerank(body) -> dict``
    Validate, then score each row against ``q``::

        {"q": str, "rows": [<input row with "score" set>, ...], "algorithm": "rerank:<reranker>"}

    Rows are best first; equal scores keep their input order.

Errors: `ValidationError` for bad input, including a source removed between the view's validation and
the run (the run validates again); `concepts.errors.ConceptsError` subclasses for configuration problems
(`UnknownEmbedder`, `EmbedderUnavailable`).
"""
import os
import re
import time

from django.conf import settings
from rest_framework.exceptions import ValidationError

from concepts.matching import store
from concepts.matching.embedders import DEFAULT_EMBEDDER
from concepts.matching.pipeline import match
from concepts.matching.ranking import SCORE_DECIMALS
from concepts.matching.rerank import DEFAULT_RERANKER, make_reranker, rerank
from concepts.models import Source

MAX_ROWS = 1000            # rows per $match or $rerank body
MAX_TEXT_CHARS = 1000      # characters in one row's name (and in q, and in each synonym)
MAX_SYNONYMS = 100         # synonyms per $rerank row
DEFAULT_LIMIT = 5
MAX_LIMIT = 100

_SOURCE_URL = re.compile(
    r'^/?orgs/(?P<org>[^/\s]+)/sources/(?P<mnemonic>[^/\s]+)(?:/(?P<version>[^/\s]+))?/?$')


def embedder_name():
    """Setting CONCEPTS_EMBEDDER, else the environment variable of that name, else tfidf-svd."""
    return (getattr(settings, 'CONCEPTS_EMBEDDER', None) or os.environ.get('CONCEPTS_EMBEDDER')
            or DEFAULT_EMBEDDER)


def reranker_name():
    """Setting CONCEPTS_RERANKER, else the environment variable of that name, else fuzzy."""
    return (getattr(settings, 'CONCEPTS_RERANKER', None) or os.environ.get('CONCEPTS_RERANKER')
            or DEFAULT_RERANKER)


# --- validation -------------------------------------------------------------------------------------------

def _check_rows(rows, errors, allow_synonyms):
    if not isinstance(rows, list) or not rows:
        errors['rows'] = ['Invalid or missing "rows" in request body.']
        return
    if len(rows) > MAX_ROWS:
        errors['rows'] = [f'At most {MAX_ROWS} rows per request, got {len(rows)}.']
        return
    problems = []
    for number, row in enumerate(rows):
        name = row.get('name') if isinstance(row, dict) else None
        if not isinstance(name, str) or not name.strip():
            problems.append(f'Row {number}: each row must be an object with a non-empty "name" string.')
        elif len(name) > MAX_TEXT_CHARS:
            problems.append(f'Row {number}: "name" is longer than {MAX_TEXT_CHARS} characters.')
        elif allow_synonyms and 'synonyms' in row:
            synonyms = row['synonyms']
            if (not isinstance(synonyms, list) or len(synonyms) > MAX_SYNONYMS
                    or not all(isinstance(s, str) and len(s) <= MAX_TEXT_CHARS for s in synonyms)):
                problems.append(f'Row {number}: "synonyms" must be a list of at most {MAX_SYNONYMS} strings '
                                f'of at most {MAX_TEXT_CHARS} characters.')
        if len(problems) >= 10:  # enough to fix the client; the rest are probably the same mistake
            break
    if problems:
        errors['rows'] = problems


def find_source(url):
    """The loaded Source a target_repo_url names (with or without its current version), or None."""
    match = _SOURCE_URL.match(url.strip()) if isinstance(url, str) else None
    if not match:
        return None
    source = Source.objects.filter(org=match['org'], mnemonic=match['mnemonic']).first()
    if source is None or match['version'] not in (None, source.version):
        return None
    return source


def source_version(url):
    """What a `$match` result depends on of the source `url` names: its version and the checksum of its
    loaded concepts (a reload with new concepts changes it too), or None for no loaded source. Read from
    the database every time: a new version makes earlier results stale at once (workers.sharing)."""
    source = find_source(url)
    return f'{source.org}/{source.mnemonic}@{source.version}#{source.checksum}' if source is not None else None


_known_sources = {}  # url as sent -> (monotonic expiry, canonical url): sources the API found recently


def validate_match_body(data):
    """The cleaned `$match` body, or ValidationError naming the fields.

    In the API a source found once is trusted for CONCEPTS_SOURCE_CACHE_SECONDS (a query saved on every
    heavy call); the worker validates again against the database before it runs the call.
    """
    url = data.get('target_repo_url') if isinstance(data, dict) else None
    now = time.monotonic()
    expires, canonical = _known_sources.get(url, (0, None)) if isinstance(url, str) else (0, None)
    if expires > now:
        return _clean_match_body(data, known_url=canonical)[0]
    body, source = _clean_match_body(data)
    if len(_known_sources) > 1000:
        _known_sources.clear()
    _known_sources[url] = (now + settings.CONCEPTS_SOURCE_CACHE_SECONDS, source.url)
    return body


def forget_sources():
    """Drop the API's cache of known sources (tests, and after a source is removed in this process)."""
    _known_sources.clear()


def _clean_match_body(data, known_url=None):
    """(cleaned body, its Source, or None when `known_url` was given) or ValidationError."""
    if not isinstance(data, dict):
        raise ValidationError({'non_field_errors': ['Request body must be a JSON object.']})
    errors = {}
    _check_rows(data.get('rows'), errors, allow_synonyms=False)

    url = data.get('target_repo_url')
    source = None
    if url is None or url == '':
        errors['target_repo_url'] = ['Missing "target_repo_url" in request body.']
    elif not known_url:
        source = find_source(url)
        if source is None:
            errors['target_repo_url'] = [(
                f'Unknown source {url!r}: expected the url of a loaded source, /orgs/<org>/sources/<source>/ '
                '(GET /sources/ lists them).')]

    limit = data.get('limit', DEFAULT_LIMIT)
    if isinstance(limit, str) and limit.strip().isascii() and limit.strip().isdecimal():
        limit = int(limit)  # ASCII digits only: '²' and '①' are digits to str.isdigit, not to int()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        errors['limit'] = [f'"limit" must be an integer from 1 to {MAX_LIMIT}.']

    if errors:
        raise ValidationError(errors)
    return {'rows': data['rows'], 'target_repo_url': known_url or source.url, 'limit': limit}, source


def validate_rerank_body(data):
    if not isinstance(data, dict):
        raise ValidationError({'non_field_errors': ['Request body must be a JSON object.']})
    errors = {}
    q = data.get('q')
    if q is None:
        errors['q'] = ['Missing "q" in request body.']
    elif not isinstance(q, str) or not q.strip():
        errors['q'] = ['"q" must be a non-empty string.']
    elif len(q) > MAX_TEXT_CHARS:
        errors['q'] = [f'"q" is longer than {MAX_TEXT_CHARS} characters.']
    _check_rows(data.get('rows'), errors, allow_synonyms=True)
    if errors:
        raise ValidationError(errors)
    return {'q': q, 'rows': data['rows']}


# --- running ----------------------------------------------------------------------------------------------

def run_match(body, semantic, reranker):
    body, source = _clean_match_body(body)  # again: a worker runs later than the view that validated
    limit = body['limit']
    queries = [row['name'] for row in body['rows']]

    index = store.semantic_index(source, embedder_name()) if semantic else store.lexical_index(source)
    scorer = make_reranker(reranker_name()) if reranker else None
    ranked = match(index, queries, limit, scorer)
    table = index.table

    results = []
    for row, hits in zip(body['rows'], ranked):
        results.append({'row': row, 'candidates': [
            {'code': table.codes[hit.concept], 'name': table.name(hit.concept),
             'concept_class': table.classes[hit.concept], 'score': hit.score,
             'matched': table.texts[hit.entry]}
            for hit in hits]})
    algorithm = index.algorithm + (f'+rerank:{scorer.name}' if scorer else '')
    return {'results': results, 'source': source.url, 'source_version': source.version,
            'algorithm': algorithm}


def run_rerank(body):
    body = validate_rerank_body(body)
    scorer = make_reranker(reranker_name())
    candidates = [[[row['name'], *row.get('synonyms', [])] for row in body['rows']]]
    scored = rerank(scorer, [body['q']], candidates)[0]
    order = sorted(range(len(scored)), key=lambda i: (-round(scored[i].score, SCORE_DECIMALS), i))
    rows = [{**body['rows'][i], 'score': round(scored[i].score, SCORE_DECIMALS)} for i in order]
    return {'q': body['q'], 'rows': rows, 'algorithm': f'rerank:{scorer.name}'}
