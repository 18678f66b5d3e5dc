"""Bulk semantic `$match` calls, which run k-nearest-neighbour search on the search backend.

Sized by `es2_knn` less the single-row reserve (never below 0): the kNN share bulk calls may use.
"""
QUEUE = 'es2_knn'
SIZED_BY = 'es2_knn - reserve_single_row'


def carries(endpoint, rows, semantic):
    return endpoint == '$match' and rows != 1 and semantic


def pool_size(config):
    return max(config['es2_knn'] - config['reserve_single_row'], 0)
