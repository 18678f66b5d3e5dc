"""Single-row `$match` calls (semantic or reranked): a person waiting on one row.

Sized by `reserve_single_row`, the slots only single-row calls may use, so a bulk run never delays them.
"""
QUEUE = 'interactive'
SIZED_BY = 'reserve_single_row'


def carries(endpoint, rows, semantic):
    return endpoint == '$match' and rows == 1


def pool_size(config):
    return config['reserve_single_row']
