"""How big an answer can get, checked before the call is admitted: a body whose answer could pass a bound
is a 400 naming the bound and its value, so nothing admitted can outgrow it.

Three bounds, all Django settings (from the environment):

- ``MAX_MATCH_CANDIDATES`` (10,000): the candidates a `$match` answer can hold, rows × the candidates a row
  can get (``limit``, at most the source's concepts after ``offset``). OCL bounds neither: its `$match`
  takes any number of rows, any ``limit`` (Elasticsearch's ``max_result_window``, 10,000 by default, caps
  offset + limit per row) and bodies up to 200 MB; its own Mapper sends 50 rows a call with ``limit`` 1,
  and one row with ``limit`` 5 for a row's other candidates.
- ``MAX_ANSWER_BYTES`` (32 MiB): the most bytes the answer can take as the API renders it (compact UTF-8
  JSON), of `$match` and `$rerank` alike. A `$match` entry echoes its row, ``map_config`` and ``filter``
  (once per row: a large ``map_config`` is multiplied by the rows) and holds up to ``limit`` candidates,
  each at most the source's largest: its biggest concept rendered as the answer renders it (``verbose``
  or not), with every word of its name and of its longest name or synonym highlighted and the longest
  numbers. A `$rerank` answer is its rows, each with a score added.
- ``MAX_ECHO_BYTES`` (4 MiB): the bytes a `$match` answer spends echoing the body's ``map_config`` and
  ``filter``, rows × their rendered size. OCL echoes both, as sent, in every row's entry; a body of 57 KB
  (1,000 rows and a 29 KB ``map_config``) made a 29.5 MB answer, 500 times its size. The OCL Mapper's
  calls echo a few hundred bytes a row.

The estimate is an upper bound, not a guess: the echoes are measured, and no candidate can render larger
than its source's largest (measured once per source version and process, `candidate_sizes`). It is
pessimistic for sources whose concepts differ much in size (HPO: the largest verbose candidate is 3.6 KB,
the mean about 1 KB).

Why Django settings and not the runtime capacity config: the bounds size what one process holds (the pool
process that builds an answer, the API process that serves it), a property of the deployment like
``MAX_REQUEST_BYTES`` beside them, set when processes start and the same in all of them; the capacity
config shares capacity between callers at runtime. And the matching domain stays free of the limiter.
"""
import json
import threading
from dataclasses import dataclass

from django.conf import settings
from rest_framework.exceptions import ValidationError

from common.database import locked_with_connection
from concepts import ocl
from concepts.models import Concept

LONGEST_FLOAT = -1.2345678901234567e-300  # as long as a float's repr gets (24 characters)
# What a $match entry adds around its row, map_config, filter and candidates, and the comma after it.
ENTRY_BYTES = len(json.dumps({'row': 0, 'results': [], 'map_config': 0, 'filter': 0},
                             separators=(',', ':'))) - 3 + 1
# What $rerank adds to a row, at most: its score, and search_meta with the normalized score.
SCORED_ROW_BYTES = len(json.dumps({'search_meta': {'search_normalized_score': LONGEST_FLOAT}, 's': LONGEST_FLOAT},
                                  separators=(',', ':'))) + 1


@dataclass(frozen=True)
class CandidateSizes:
    """A source's concept count and the bytes of its largest candidate, rendered plain and verbose."""

    concepts: int
    plain: int
    verbose: int


def rendered_bytes(value):
    """Bytes of `value` as the API renders it: DRF's JSONRenderer (compact, UTF-8, U+2028/9 escaped)."""
    text = json.dumps(value, ensure_ascii=False, separators=(',', ':'))
    return len(text.encode('utf-8')) + 3 * (text.count('\u2028') + text.count('\u2029'))


_sizes = {}  # (source pk, checksum) -> CandidateSizes
_sizes_lock = threading.Lock()


def candidate_sizes(source):
    """The CandidateSizes of `source`, measured once per version in this process (HPO, 19,034 concepts: 1.1 to
    6 s on a loaded 2-core machine)."""
    key = (source.pk, source.checksum)
    sizes = _sizes.get(key)
    if sizes is None:
        with locked_with_connection(_sizes_lock):  # a burst of first calls measures once
            sizes = _sizes.get(key)
            if sizes is None:
                sizes = _sizes[key] = _measure(source)
    return sizes


def _measure(source):
    count, plain, verbose = 0, 0, 0
    rows = Concept.objects.filter(source=source).values_list('code', 'name', 'concept_class', 'synonyms')
    for code, name, concept_class, synonyms in rows.iterator(chunk_size=2000):
        texts = [name, *(synonyms or [])]
        longest = max((ocl.fully_highlighted(text) for text in texts), key=rendered_bytes)
        meta = {'search_score': LONGEST_FLOAT, 'search_rerank_score': LONGEST_FLOAT, 'search_confidence': '',
                'search_highlight': {'name': [ocl.fully_highlighted(name)], 'synonyms': [longest]},
                'match_type': 'very_high', 'search_normalized_score': LONGEST_FLOAT,
                'algorithm': ocl.algorithm_name(True)}
        count += 1
        brief = ocl.concept(source, code, name, concept_class, texts, meta, False)
        full = ocl.concept(source, code, name, concept_class, texts, meta, True)
        size = rendered_bytes(brief)
        plain = max(plain, size)
        # The verbose candidate is the plain one with more keys: rendered, those add their own bytes less
        # the braces, plus a comma (rendering only them halves the time this takes).
        verbose = max(verbose, size + rendered_bytes({k: v for k, v in full.items() if k not in brief}) - 1)
    return CandidateSizes(count, plain, verbose)


def forget():
    """Drop the measured sizes (tests)."""
    _sizes.clear()


def match_answer_bytes(body, params, sizes):
    """The most bytes the `$match` answer to `body` (validated) can take: see the module docstring."""
    per_row = candidates_per_row(params, sizes)
    candidate = (sizes.verbose if params['verbose'] else sizes.plain) + 1  # and its comma
    echoed = rendered_bytes(body['map_config']) + rendered_bytes(body['filter'])
    return 2 + sum(rendered_bytes(row) + echoed + ENTRY_BYTES + per_row * candidate for row in body['rows'])


def candidates_per_row(params, sizes):
    return min(params['limit'], max(sizes.concepts - params['start'], 0))


def check_match(body, params, sizes):
    """Raise ValidationError (on `rows`, naming the bound and its value) when the answer could pass a bound."""
    rows, per_row = len(body['rows']), candidates_per_row(params, sizes)
    most = settings.MAX_MATCH_CANDIDATES
    if rows * per_row > most:
        message = (f'{rows} rows x {per_row} candidates each (limit {params["limit"]}) can answer {rows * per_row} '
                   f'candidates; the bound MAX_MATCH_CANDIDATES is {most} a call: send fewer rows or a lower limit.')
        raise ValidationError({'rows': [message]})
    echoed = rows * (rendered_bytes(body['map_config']) + rendered_bytes(body['filter']))
    if echoed > settings.MAX_ECHO_BYTES:
        raise ValidationError({'rows': [
            f'{rows} rows would echo map_config and filter in {echoed} bytes; the bound MAX_ECHO_BYTES is '
            f'{settings.MAX_ECHO_BYTES} bytes a call: send fewer rows or a smaller map_config and filter '
            '(each row\'s entry echoes them).']})
    _check_bytes(match_answer_bytes(body, params, sizes), 'send fewer rows, a lower limit, no verbose, or a '
                 'smaller map_config and filter (each row\'s entry echoes them)')


def check_rerank(body):
    """Raise ValidationError when the `$rerank` answer to `body` (validated) could pass MAX_ANSWER_BYTES."""
    size = 2 + sum(rendered_bytes(row) + SCORED_ROW_BYTES + len(body['score_key'].encode('utf-8'))
                   for row in body['rows'])
    _check_bytes(size, 'send fewer or smaller rows')


def _check_bytes(size, advice):
    most = settings.MAX_ANSWER_BYTES
    if size > most:
        raise ValidationError({'rows': [
            f'The answer could take {size} bytes; the bound MAX_ANSWER_BYTES is {most} bytes a call: {advice}.']})
