"""What a run sends: a job splits its input into batches (one call each), sends a batch, and turns the
call's final task into one RowOutcome per row.

MatchJob is `$match` for many rows, `batch_size` rows per call; RerankJob is `$rerank`, one call per query
over the same candidate rows. A row is `no_match` only when its task succeeded and returned no
candidates for it; every other ending makes it `failed`, with the reason.
"""
from dataclasses import dataclass

from heavy_lanes_client import errors
from heavy_lanes_client.models import MATCH, RERANK, RowOutcome, RowStatus, State
from heavy_lanes_client.rows import as_rows

MAX_BATCH = 1000  # rows per call the API accepts


@dataclass(frozen=True)
class Batch:
    """One call of a run: its number, the input index of its first item, and its items."""

    index: int
    start: int
    items: tuple


def _row_name(row):
    return row if isinstance(row, str) else str(row.get('name', ''))


def _task_failure(task):
    """Why a task that did not succeed failed its rows: its final state and the server's error."""
    return f'task {task.state}' + (f': {task.error}' if task.error else '')


def _row_outcome(batch, offset, name, task, key, candidates):
    """The row at `offset` in `batch`, which the task ran: matched (best candidate first), no match (an
    empty list), or failed when the result has no list for it."""
    common = {'index': batch.start + offset, 'name': name, 'task_id': task.id, 'idempotency_key': key,
              'batch': batch.index}
    if not isinstance(candidates, list):
        return RowOutcome(status=RowStatus.FAILED, reason='the task result has no entry for this row',
                          **common)
    if candidates:
        return RowOutcome(status=RowStatus.MATCHED, top=candidates[0], candidates=tuple(candidates), **common)
    return RowOutcome(status=RowStatus.NO_MATCH, **common)


def candidates_of(entry):
    """A row entry's candidates, best first: OCL's `results` list of concepts, or the earlier
    `candidates`; None when the entry has neither."""
    if not isinstance(entry, dict):
        return None
    for name in ('results', 'candidates'):
        if isinstance(entry.get(name), list):
            return entry[name]
    return None


class Job:
    """What MatchJob and RerankJob share. A job also has `label`, `batches()`, `names(batch)`,
    `submit(client, batch, key, metadata)` and `_ran(batch, found, task, key)`, which reads the list
    named `result_key` out of a succeeded task's result."""

    endpoint = None
    result_key = None
    # 400s about these fields concern every batch: stop the run.
    shared_fields = frozenset({'non_field_errors'})

    def failed(self, batch, reason, key, task_id=None):
        """Every row of `batch` failed for `reason`."""
        return [RowOutcome(index=batch.start + i, name=name, status=RowStatus.FAILED, reason=reason,
                           task_id=task_id, idempotency_key=key, batch=batch.index)
                for i, name in enumerate(self.names(batch))]

    def outcomes(self, batch, task, key):
        """One RowOutcome per row of `batch`, from its call's final task."""
        if task.state != State.SUCCEEDED:
            return self.failed(batch, _task_failure(task), key, task.id)
        found = self.entries(task.result)
        if not isinstance(found, list):
            reason = f'task succeeded but its result has no "{self.result_key}" list'
            return self.failed(batch, reason, key, task.id)
        return self._ran(batch, found, task, key)

    def entries(self, result):
        """The list of a succeeded task's result this job reads, or None: OCL's answers are lists (the
        scored rows of $rerank); earlier servers' were objects holding it under `result_key`."""
        if isinstance(result, list):
            return result
        return result.get(self.result_key) if isinstance(result, dict) else None

    def is_fatal(self, error):
        """Whether a rejection concerns every batch of the run (so sending the others is pointless)."""
        if isinstance(error, errors.IdempotencyConflict):
            return False
        if isinstance(error, errors.InvalidRequest) and error.fields:
            return bool(set(error.fields) & self.shared_fields)
        return True


class MatchJob(Job):
    """`$match` for many rows, `batch_size` rows per call."""

    endpoint = MATCH
    result_key = 'results'
    shared_fields = Job.shared_fields | {'target_repo_url', 'limit'}

    def __init__(self, rows, source, *, semantic=True, reranker=False, limit=5, batch_size=25):
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f'batch_size must be 1..{MAX_BATCH}')
        self.rows = as_rows(rows)
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

    def entries(self, result):
        """One entry per input row: OCL's wire format is the list itself, each entry
        `{"row": ..., "results": [<concept>, ...]}`; the earlier shape was an object whose `results` list
        holds `{"row": ..., "candidates": [...]}` entries."""
        if isinstance(result, list):
            return result
        return super().entries(result)

    def _ran(self, batch, results, task, key):
        """The server returns one entry per input row, in order; a row is matched by position."""
        out = []
        for i, name in enumerate(self.names(batch)):
            entry = results[i] if i < len(results) else None
            out.append(_row_outcome(batch, i, name, task, key, candidates_of(entry)))
        return out


class RerankJob(Job):
    """`$rerank`: one call per query, each scoring the same candidate rows."""

    endpoint = RERANK
    result_key = 'rows'
    shared_fields = Job.shared_fields | {'rows'}

    def __init__(self, queries, candidates):
        self.queries = [str(query) for query in queries]
        self.candidates = as_rows(candidates)
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

    def _ran(self, batch, rows, task, key):
        return [_row_outcome(batch, 0, batch.items[0], task, key, rows)]
