"""What a run sends: a job splits its input into batches (one call each), sends a batch, and turns the
call's final task into one RowOutcome per row.

MatchJob is `$match` for many rows, `batch_size` rows per call; RerankJob is `$rerank`, one call per query
over the same candidate rows. A row is `no_match` only when its task succeeded and returned no
candidates for it; every other ending makes it `failed`, with the reason.
"""
from dataclasses import dataclass

from heavy_lanes_client import errors
from heavy_lanes_client.models import MATCH, RERANK, RowOutcome, RowStatus, State

MAX_BATCH = 1000  # rows per call the API accepts


@dataclass(frozen=True)
class Batch:
    """One call of a run: its number, the input index of its first item, and its items."""

    index: int
    start: int
    items: tuple


def _row_name(row):
    return row if isinstance(row, str) else str(row.get('name', ''))


def failed_rows(batch, names, reason, key, task_id=None):
    return [RowOutcome(index=batch.start + i, name=name, status=RowStatus.FAILED, reason=reason,
                       task_id=task_id, idempotency_key=key, batch=batch.index)
            for i, name in enumerate(names)]


def _task_failure(task):
    """Why a task that did not succeed failed its rows: its final state and the server's error."""
    return f'task {task.state}' + (f': {task.error}' if task.error else '')


class MatchJob:
    """`$match` for many rows, `batch_size` rows per call."""

    endpoint = MATCH
    # 400s about these fields concern every batch: stop the run.
    shared_fields = frozenset({'target_repo_url', 'limit', 'non_field_errors'})

    def __init__(self, rows, source, *, semantic=True, reranker=False, limit=5, batch_size=25):
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f'batch_size must be 1..{MAX_BATCH}')
        self.rows = [{'name': row} if isinstance(row, str) else dict(row) for row in rows]
        if not self.rows:
            raise ValueError('no rows to match')
        self.source = source
        self.semantic = semantic
        self.reranker = reranker
        self.limit = limit
        self.batch_size = batch_size
        flags = [flag for flag, on in (('semantic', semantic), ('reranker', reranker)) if on] or ['lexical']
        self.label = f'$match ({"+".join(flags)})'

    def batches(self):
        size = self.batch_size
        return [Batch(number, start, tuple(self.rows[start:start + size]))
                for number, start in enumerate(range(0, len(self.rows), size))]

    def names(self, batch):
        return [_row_name(row) for row in batch.items]

    def submit(self, client, batch, key, metadata):
        return client.submit_match(list(batch.items), self.source, semantic=self.semantic,
                                   reranker=self.reranker, limit=self.limit, idempotency_key=key,
                                   metadata=metadata)

    def outcomes(self, batch, task, key):
        names = self.names(batch)
        if task.state != State.SUCCEEDED:
            return failed_rows(batch, names, _task_failure(task), key, task.id)
        results = task.result.get('results') if isinstance(task.result, dict) else None
        if not isinstance(results, list):
            return failed_rows(batch, names, 'task succeeded but its result has no "results" list', key,
                               task.id)
        out = []
        for i, name in enumerate(names):
            entry = results[i] if i < len(results) else None
            candidates = entry.get('candidates') if isinstance(entry, dict) else None
            common = {'index': batch.start + i, 'name': name, 'task_id': task.id, 'idempotency_key': key,
                      'batch': batch.index}
            if not isinstance(candidates, list):
                out.append(RowOutcome(status=RowStatus.FAILED,
                                      reason='the task result has no entry for this row', **common))
            elif candidates:
                out.append(RowOutcome(status=RowStatus.MATCHED, top=candidates[0],
                                      candidates=tuple(candidates), **common))
            else:
                out.append(RowOutcome(status=RowStatus.NO_MATCH, **common))
        return out


class RerankJob:
    """`$rerank`: one call per query, each scoring the same candidate rows."""

    endpoint = RERANK
    shared_fields = frozenset({'rows', 'non_field_errors'})

    def __init__(self, queries, candidates):
        self.queries = [str(query) for query in queries]
        self.candidates = [{'name': row} if isinstance(row, str) else dict(row) for row in candidates]
        if not self.queries:
            raise ValueError('no queries to rerank for')
        if not 1 <= len(self.candidates) <= MAX_BATCH:
            raise ValueError(f'give 1..{MAX_BATCH} candidate rows')
        self.label = '$rerank'

    def batches(self):
        return [Batch(number, number, (query,)) for number, query in enumerate(self.queries)]

    def names(self, batch):
        return list(batch.items)

    def submit(self, client, batch, key, metadata):
        return client.submit_rerank(batch.items[0], self.candidates, idempotency_key=key, metadata=metadata)

    def outcomes(self, batch, task, key):
        names = self.names(batch)
        if task.state != State.SUCCEEDED:
            return failed_rows(batch, names, _task_failure(task), key, task.id)
        rows = task.result.get('rows') if isinstance(task.result, dict) else None
        if not isinstance(rows, list):
            return failed_rows(batch, names, 'task succeeded but its result has no "rows" list', key, task.id)
        common = {'index': batch.start, 'name': names[0], 'task_id': task.id, 'idempotency_key': key,
                  'batch': batch.index}
        if not rows:
            return [RowOutcome(status=RowStatus.NO_MATCH, **common)]
        return [RowOutcome(status=RowStatus.MATCHED, top=rows[0], candidates=tuple(rows), **common)]


def is_fatal(job, error):
    """Whether a rejection concerns every batch of the run (so sending the others is pointless)."""
    if isinstance(error, errors.IdempotencyConflict):
        return False
    if isinstance(error, errors.InvalidRequest) and error.fields:
        return bool(set(error.fields) & job.shared_fields)
    return True
