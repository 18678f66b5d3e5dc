"""Bulk reranked lexical `$match` calls and every `$rerank` call.

Sized by `api_heavy.cluster` less the single-row reserve (never below 0).
"""
QUEUE = 'api_heavy'
SIZED_BY = 'api_heavy.cluster - reserve_single_row'


def carries(endpoint, rows, semantic):
    return endpoint == '$rerank' or (endpoint == '$match' and rows != 1 and not semantic)


def pool_size(config):
    return max(config['api_heavy']['cluster'] - config['reserve_single_row'], 0)
