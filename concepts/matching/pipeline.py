"""Retrieve, then optionally rerank: the one code path behind `$match` (and the quality benchmark)."""
from concepts.matching.ranking import SCORE_DECIMALS, Hit
from concepts.matching.rerank import rerank

RERANK_DEPTH = 25  # candidates retrieved per query before reranking, when `limit` is smaller


def match(index, queries, limit, reranker=None, depth=RERANK_DEPTH):
    """For each query, up to `limit` `Hit`s from `index`, best first, equal scores by code.

    With a `reranker`, `max(limit, depth)` candidates are retrieved and rescored with it (every name and
    synonym of each candidate, and its definition, against the query: `rerank.rerank`); the hit's score
    and matched entry are then the reranker's.
    """
    if reranker is None:
        return index.search(queries, limit)
    table = index.table
    hits = index.search(queries, max(limit, depth))
    rescored = rerank(reranker, queries, [[table.entries(hit.concept) for hit in row] for row in hits],
                      [[table.definition(hit.concept) for hit in row] for row in hits])
    ranked = []
    for row_hits, row_scores in zip(hits, rescored):
        row = [Hit(hit.concept, round(s.score, SCORE_DECIMALS), int(table.starts[hit.concept]) + s.matched)
               for hit, s in zip(row_hits, row_scores)]
        row.sort(key=lambda hit: (-hit.score, hit.concept))  # table order is code order
        ranked.append(row[:limit])
    return ranked
