"""The matching domain's service functions: what the `$match` / `$rerank` views and tasks call.

Plain functions of JSON-ready values; nothing here knows about lanes, capacity or Celery.

``validate_match(data, query) -> dict``
    Check a `$match` body and its query parameters (OCL's: ``limit``, ``offset``, ``page``, ``bestMatch``,
    ``verbose``; docs/api.md lists the rest, accepted and not applied) and return the call's payload
    ``{"body": {"rows", "target_repo_url": <canonical url>, "map_config", "filter"}, "params": {"limit",
    "start", "best_match", "verbose"}}``. ``target_repo`` (``owner``, ``source``, ``source_version``) may
    stand in for ``target_repo_url``, as in OCL. Raises `rest_framework.exceptions.ValidationError` whose
    detail names each bad field (``rows``, ``target_repo_url``, ``limit``, ...), also when the answer could
    pass a bound (concepts.bounds: candidates, bytes). Needs the database (the source must be loaded).
    Idempotent: a payload validates to itself (`validate_payload`), so it can be stored, queued as JSON, and
    validated again by the worker (which doesn't check the bounds again: the call was admitted under them).

``validate_rerank_body(data) -> dict``
    Check a `$rerank` body: ``{"q": str, "rows": [object, ...], "name_key", "score_key"}`` (OCL's defaults
    ``display_name`` and ``search_rerank_score``), whose answer must fit MAX_ANSWER_BYTES (concepts.bounds).
    No database.

``run_match(payload, semantic: bool, reranker: bool) -> list``
    Validate, then match each row's ``name`` against the source: OCL's answer, one entry per input row in
    input order, ``{"row": <the row as sent>, "results": [<concept>, ...], "map_config", "filter"}``, each
    concept in OCL's shape with its ``search_meta`` (concepts.ocl). Candidates are best first by
    ``search_score``; equal scores (at 6 decimals) are ordered by code. ``semantic=False`` retrieves with
    BM25, ``semantic=True`` by cosine similarity of embeddings (``CONCEPTS_EMBEDDER``); ``reranker=True``
    retrieves ``max(start + limit, pipeline.RERANK_DEPTH)`` candidates and rescores them with the reranker
    (``CONCEPTS_RERANKER``; scores in [0, 1]).

``match_answer(payload, semantic: bool, reranker: bool) -> MatchAnswer``
    The same answer, matched (every row ranked) but with its entries made one at a time as it is iterated,
    so whoever sends it never holds it whole (the API streams a lexical answer: api.renderers); its
    ``count`` of candidates and an upper bound of its size (``most_bytes()``) are known before.

``run_rerank(body) -> list``
    Validate, then score each row's ``name_key`` text against ``q``: OCL's answer, the rows best first,
    each with its score set (concepts.ocl.scored_row); equal scores keep their input order.

``index_status() -> dict``
    For status pages: each loaded source's lexical and semantic index, ``{source url: {"lexical": {...},
    "semantic": {..., "embedder"}}}``, each part ``{"state": "ready" | "building" | "failed" | "missing",
    "step", "done", "total", "elapsed_seconds", "error"}`` (concepts.matching.store.part_status). Reads
    files only: never builds, loads or waits.

Errors: `ValidationError` for bad input, including a source removed between the view's validation and
the run (the run validates again); `concepts.errors.ConceptsError` subclasses for configuration problems
(`UnknownEmbedder`, `EmbedderUnavailable`).
"""
import os
import re
import time

from django.conf import settings
from rest_framework.exceptions import ValidationError

from concepts import bounds, ocl
from concepts.matching import store
from concepts.matching.embedders import DEFAULT_EMBEDDER, make_embedder
from concepts.matching.index import SemanticIndex
from concepts.matching.pipeline import match
from concepts.matching.ranking import SCORE_DECIMALS
from concepts.matching.rerank import (
    DEFAULT_RERANKER,
    FuzzyReranker,
    make_reranker,
    rerank,
    reranks_with_index,
)
from concepts.models import Source
from common.numbers import whole_number

MAX_ROWS = 1000            # rows per $match or $rerank body
MAX_TEXT_CHARS = 1000      # characters in one row's name (and in q, and in each synonym)
MAX_SYNONYMS = 100         # synonyms per $rerank row
DEFAULT_LIMIT = 1           # OCL's $match default
MAX_LIMIT = 100
MAX_WINDOW = 1000          # offset + limit
PROGRESS_CHUNK_ROWS = 64    # rows matched between two progress reports, at least (run_match)
TRUTHY = ('true', '1', 'yes', 'on')

_SOURCE_URL = re.compile(
    r'^/?orgs/(?P<org>[^/\s]+)/sources/(?P<mnemonic>[^/\s]+)(?:/(?P<version>[^/\s]+))?/?$')


def embedder_name():
    """Setting CONCEPTS_EMBEDDER, else the environment variable of that name, else minilm."""
    return (getattr(settings, 'CONCEPTS_EMBEDDER', None) or os.environ.get('CONCEPTS_EMBEDDER')
            or DEFAULT_EMBEDDER)


def reranker_name():
    """Setting CONCEPTS_RERANKER, else the environment variable of that name, else semantic."""
    return (getattr(settings, 'CONCEPTS_RERANKER', None) or os.environ.get('CONCEPTS_RERANKER')
            or DEFAULT_RERANKER)


# --- validation -------------------------------------------------------------------------------------------

def _check_rows(rows, errors, named=True):
    if not isinstance(rows, list) or not rows:
        errors['rows'] = ['Invalid or missing "rows" in request body.']
        return
    if len(rows) > MAX_ROWS:
        errors['rows'] = [f'At most {MAX_ROWS} rows per request, got {len(rows)}.']
        return
    problems = []
    for number, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(f'Row {number}: each row must be an object.')
        elif named:
            name = row.get('name')
            if not isinstance(name, str) or not name.strip():
                problems.append(f'Row {number}: each row must be an object with a non-empty "name" string.')
            elif len(name) > MAX_TEXT_CHARS:
                problems.append(f'Row {number}: "name" is longer than {MAX_TEXT_CHARS} characters.')
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


_known_sources = {}  # url as sent -> (monotonic expiry, canonical url, its CandidateSizes): sources found recently


def _whole(value, name, low, high, errors):
    """`value` (a query string or a JSON number) as an int in low..high, or None with errors[name] set."""
    if isinstance(value, str):
        # ASCII digits only (common.numbers): '²' and '①' are digits to str.isdigit, not to int(), and
        # int() fails past 4300 of them.
        value = whole_number(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        errors[name] = [f'"{name}" must be an integer from {low} to {high}.']
        return None
    return value


def parse_match_params(query, body_limit=None):
    """The `$match` query parameters that change its answer, checked: {"limit", "start", "best_match",
    "verbose"}. `limit` comes from the query string, as in OCL (a `limit` in the body is read when the
    query has none); `offset`, else `page`, sets the first candidate returned."""
    query = query or {}
    errors = {}
    limit = query.get('limit')
    if limit in (None, ''):
        limit = DEFAULT_LIMIT if body_limit is None else body_limit
    limit = _whole(limit, 'limit', 1, MAX_LIMIT, errors)
    offset = query.get('offset')
    start = _whole(offset, 'offset', 0, MAX_WINDOW, errors) if offset not in (None, '') else None
    page = query.get('page')
    page = _whole(page, 'page', 1, MAX_WINDOW, errors) if page not in (None, '') else 1
    if not errors and start is None:
        start = (page - 1) * limit
    if not errors and start + limit > MAX_WINDOW:
        errors['offset'] = [f'offset (or page) and limit reach past candidate {MAX_WINDOW}.']
    if errors:
        raise ValidationError(errors)
    return {'limit': limit, 'start': start, 'best_match': _truthy(query.get('bestMatch')),
            'verbose': _truthy(query.get('verbose'))}


def _truthy(value):
    return isinstance(value, str) and value.strip().lower() in TRUTHY or value is True


def validate_match(data, query=None):
    """The payload of a `$match` call (body and parameters), or ValidationError naming the fields.

    In the API a source found once is trusted for CONCEPTS_SOURCE_CACHE_SECONDS (a query saved on every
    heavy call); the worker validates again against the database before it runs the call.
    """
    params = parse_match_params(query, data.get('limit') if isinstance(data, dict) else None)
    url = _target_url(data) if isinstance(data, dict) else None
    now = time.monotonic()
    known = _known_sources.get(url) if isinstance(url, str) else None
    expires, canonical, sizes = known or (0, None, None)
    if expires > now:
        body = _clean_match_body(data, known_url=canonical)[0]
    else:
        body, source = _clean_match_body(data)
        sizes = bounds.candidate_sizes(source)
        if len(_known_sources) > 1000:
            _known_sources.clear()
        _known_sources[url] = (now + settings.CONCEPTS_SOURCE_CACHE_SECONDS, source.url, sizes)
    bounds.check_match(body, params, sizes)
    return {'body': body, 'params': params}


def validate_payload(payload):
    """A stored `$match` payload checked again, against the database: (payload, its Source)."""
    if not isinstance(payload, dict) or not isinstance(payload.get('params'), dict):
        raise ValidationError({'non_field_errors': ['A $match payload has a body and its params.']})
    stored, errors = payload['params'], {}
    limit = _whole(stored.get('limit'), 'limit', 1, MAX_LIMIT, errors)
    start = _whole(stored.get('start', 0), 'offset', 0, MAX_WINDOW - (limit or 0), errors)
    if errors:
        raise ValidationError(errors)
    params = {'limit': limit, 'start': start, 'best_match': bool(stored.get('best_match')),
              'verbose': bool(stored.get('verbose'))}
    body, source = _clean_match_body(payload.get('body'))
    return {'body': body, 'params': params}, source


def forget_sources():
    """Drop the API's cache of known sources (tests, and after a source is removed in this process)."""
    _known_sources.clear()


def _target_url(data):
    """`target_repo_url`, else the url OCL's `target_repo` object names."""
    url = data.get('target_repo_url')
    repo = data.get('target_repo')
    if url in (None, '') and isinstance(repo, dict) and repo.get('owner') and repo.get('source'):
        version = repo.get('source_version')
        url = f"/orgs/{repo['owner']}/sources/{repo['source']}/" + (f'{version}/' if version else '')
    return url


def _clean_match_body(data, known_url=None):
    """(cleaned body, its Source, or None when `known_url` was given) or ValidationError."""
    if not isinstance(data, dict):
        raise ValidationError({'non_field_errors': ['Request body must be a JSON object.']})
    errors = {}
    _check_rows(data.get('rows'), errors)

    url = _target_url(data)
    source = None
    if url is None or url == '':
        errors['target_repo_url'] = ['Missing "target_repo_url" (or "target_repo") in request body.']
    elif not known_url:
        source = find_source(url)
        if source is None:
            errors['target_repo_url'] = [(
                f'Unknown source {url!r}: expected the url of a loaded source, /orgs/<org>/sources/<source>/ '
                '(GET /sources/ lists them).')]
    map_config = data.get('map_config', [])
    if not isinstance(map_config, list):
        errors['map_config'] = ['"map_config" must be a list.']
    filters = data.get('filter', {})
    if not isinstance(filters, dict):
        errors['filter'] = ['"filter" must be an object.']
    if errors:
        raise ValidationError(errors)
    return {'rows': data['rows'], 'target_repo_url': known_url or source.url, 'map_config': map_config,
            'filter': filters}, source


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
    _check_rows(data.get('rows'), errors, named=False)
    keys = {}
    for field, default in (('name_key', ocl.RERANK_NAME_KEY), ('score_key', ocl.RERANK_SCORE_KEY)):
        value = data.get(field) or default
        if not isinstance(value, str) or len(value) > 200 or (field == 'score_key' and '.' in value):
            errors[field] = [f'"{field}" must be a field name' + (' (no dots).' if field == 'score_key' else '.')]
        keys[field] = value
    model = data.get('encoder_model')
    if model not in (None, '', reranker_name()):
        errors['encoder_model'] = [f'Only the reranker {reranker_name()!r} is available here.']
    if errors:
        raise ValidationError(errors)
    body = {'q': q, 'rows': data['rows'], **keys}
    bounds.check_rerank(body)
    return body


# --- running ----------------------------------------------------------------------------------------------

def chunks(total):
    """(start, end) slices of `total` rows a run reports its progress after: tenths of them, and no fewer
    than PROGRESS_CHUNK_ROWS each. Each slice is one batch through the model and one search of the whole
    index, whose cost hardly depends on the rows in it: 20 rows matched in ten slices of 2 took 5.8 times as
    long as in one (228 against 40 ms), so a call of up to 64 rows is one slice and reports once."""
    size = max(1, PROGRESS_CHUNK_ROWS, -(-total // 10))
    return [(first, min(first + size, total)) for first in range(0, total, size)]


def run_match(payload, semantic, reranker, progress=None):
    """OCL's `$match` answer for a validated payload, as a list. `progress(rows_done, rows_total)`, when
    given, is called as the rows are matched, a chunk at a time."""
    return list(match_answer(payload, semantic, reranker, progress))


class MatchAnswer:
    """OCL's `$match` answer to one payload with every row ranked, its entries made as it is iterated.

    An entry holds its row's candidates, each a dict of a kilobyte or more, and echoes the body's
    `map_config` and `filter` (the same objects in every entry): made one at a time, the answer is never
    in memory whole, whatever its size as sent (up to MAX_ANSWER_BYTES).
    """

    def __init__(self, source, body, params, queries, ranked, table, semantic, reranked):
        self.source, self.body, self.params = source, body, params
        self.queries, self.table = queries, table
        self.semantic, self.reranked = semantic, reranked
        start, limit = params['start'], params['limit']
        # The hits each row answers with, known now so the count is (OCL's num_returned header goes first).
        self.kept = [[hit for hit in hits[start:start + limit] if self._kept(query, hit)]
                     for query, hits in zip(queries, ranked)]
        self.count = sum(len(hits) for hits in self.kept)

    def _kept(self, query, hit):
        if not self.params['best_match']:
            return True
        matched = self.table.texts[hit.entry]
        normalized = ocl.normalized_score(query, matched, hit.score, self.semantic, self.reranked)
        return ocl.match_type(normalized, self.params['limit']) in ocl.BEST_MATCH_TYPES

    def most_bytes(self):
        """The most bytes the answer can take rendered (concepts.bounds: measured once per source version
        and process, so call it where the bounds were checked: in the API)."""
        return bounds.match_answer_bytes(self.body, self.params, bounds.candidate_sizes(self.source))

    def __iter__(self):
        body, table, limit = self.body, self.table, self.params['limit']
        for row, query, hits in zip(body['rows'], self.queries, self.kept):
            results = []
            for hit in hits:
                name, matched = table.name(hit.concept), table.texts[hit.entry]
                meta = ocl.search_meta(query, name, matched, hit.score, self.semantic, self.reranked, limit)
                results.append(ocl.concept(self.source, table.codes[hit.concept], name, table.classes[hit.concept],
                                           table.entries(hit.concept), meta, self.params['verbose']))
            yield {'row': row, 'results': results, 'map_config': body['map_config'], 'filter': body['filter']}


def match_answer(payload, semantic, reranker, progress=None):
    """The MatchAnswer of a validated payload: validated again, every row ranked; `progress` as in
    run_match."""
    payload, source = validate_payload(payload)  # again: a worker runs later than the view that validated
    body, params = payload['body'], payload['params']
    limit, start = params['limit'], params['start']
    queries = [row['name'] for row in body['rows']]

    index = store.semantic_index(source, embedder_name()) if semantic else store.lexical_index(source)
    scorer = _match_reranker(source, index) if reranker else None
    if progress is None:
        ranked = match(index, queries, start + limit, scorer)
    else:
        ranked = []
        for first, end in chunks(len(queries)):
            ranked.extend(match(index, queries[first:end], start + limit, scorer))
            progress(end, len(queries))
    return MatchAnswer(source, body, params, queries, ranked, index.table, semantic, scorer is not None)


def _match_reranker(source, index):
    """The reranker of a `$match` of `source`: it reads candidates' vectors from the source's semantic index
    (`index` when the match is semantic) instead of running the model on them."""
    name = reranker_name()
    if not reranks_with_index(name):
        return make_reranker(name)
    semantic = index if isinstance(index, SemanticIndex) else store.semantic_index(source, embedder_name())
    return make_reranker(name, index=semantic)


def warm(semantic=True, lexical=True, rerank_texts=True):
    """Load every source's indexes, and the libraries matching imports, into this process; with
    `rerank_texts`, also what the fuzzy part of every reranker imports (by scoring one pair). A lane
    worker's main process calls it before it forks its pool, so each pool process, including one a resize
    adds later, starts with them (copy-on-write) instead of paying for them in its first call: about 0.7 s
    on an idle machine for the tiny terminology, mostly importing scikit-learn, and 2 s under load.
    Only parts already built are loaded: building a semantic index runs the embedder's model, and a model
    with threads of its own must not be loaded before a fork (a part not built yet is built by the first
    call that needs it, as without this). Loading a semantic index reads its arrays and the adapter's
    matrix, never the model: the ONNX session is made by the first query each pool process embeds
    (concepts.matching.minilm). With `lexical` and `rerank_texts`, the semantic index is loaded too when the
    reranker reads it. Returns the number of index parts now loaded."""
    if rerank_texts:
        FuzzyReranker().score_pairs(['warm up'], ['warm up'])
    # A reranked lexical match reads the semantic index too (see _match_reranker).
    semantic = semantic or (lexical and rerank_texts and reranks_with_index(reranker_name()))
    parts = 0
    for source in Source.objects.all():
        if lexical and store.lexical_index(source, build=False) is not None:
            parts += 1
        if semantic and store.semantic_index(source, embedder_name(), build=False) is not None:
            parts += 1
    return parts


def index_status():
    """Each loaded source's index parts and how far their build is (see the module's docstring)."""
    name = embedder_name()
    embedder = make_embedder(name)
    sources = {}
    for source in Source.objects.order_by('org', 'mnemonic'):
        key = store.source_key(source)
        sources[source.url] = {
            'lexical': store.part_status(store.lexical_directory(key)),
            'semantic': {**store.part_status(store.semantic_directory(key, embedder)), 'embedder': name},
        }
    return sources


def run_rerank(body, progress=None):
    """OCL's `$rerank` answer; `progress(rows_done, rows_total)` as in run_match."""
    body = validate_rerank_body(body)
    rows, name_key, score_key = body['rows'], body['name_key'], body['score_key']
    texts = [ocl.path_get(row, name_key) for row in rows]
    scorable = [i for i, text in enumerate(texts) if isinstance(text, str) and text.strip()]
    scores = [ocl.MISSING_SCORE] * len(rows)
    if scorable:
        scorer = make_reranker(reranker_name())
        # Each row is scored against q alone: scoring a chunk at a time gives the same scores.
        for first, end in chunks(len(scorable)) if progress is not None else [(0, len(scorable))]:
            part = scorable[first:end]
            scored = rerank(scorer, [body['q']], [[[texts[i].strip()[:MAX_TEXT_CHARS]] for i in part]])[0]
            for i, result in zip(part, scored):
                scores[i] = round(result.score, SCORE_DECIMALS)
            if progress is not None:
                progress(len(rows) - len(scorable) + end, len(rows))
    order = sorted(range(len(rows)), key=lambda i: -scores[i])  # stable: ties keep their input order
    return [ocl.scored_row(rows[i], score_key, scores[i]) for i in order]
