"""Rows in and outcomes out: read rows from a string, a file or the built-in phrases; write results.

A row is a string (its name) or a dict with a "name"; `as_rows` gives them the API's shape.

Input files, by extension:
- `.csv` / `.tsv`: a header row with a `name` column keeps every column in the row sent (so an `id`
  column comes back in each result's `row`); without one, each line's first cell is the name.
- `.json`: a list of strings or of {"name": ...} objects, or {"rows": [...]}.
- anything else: one name per line; blank lines and lines starting with `#` are skipped.
"""
import csv
import json
import random
from dataclasses import asdict
from pathlib import Path

from heavy_lanes_client.phrases import PHRASES


def as_rows(rows):
    """Rows as the API takes them: a string becomes {"name": string}; a dict is copied as it is."""
    return [{'name': row} if isinstance(row, str) else dict(row) for row in rows]


def candidate_fields(candidate):
    """(id, name, score) of a candidate in OCL's shape (a $match concept with its search_meta, a $rerank row
    with its score), or in the shape of servers before it (code, name, score)."""
    meta = candidate.get('search_meta') if isinstance(candidate.get('search_meta'), dict) else {}
    score = next((value for value in (meta.get('search_rerank_score'), meta.get('search_score'),
                                      candidate.get('search_rerank_score'), candidate.get('score'))
                  if value is not None), '')
    return (candidate.get('id', candidate.get('code', '')), candidate.get('display_name') or
            candidate.get('name', ''), score)


def parse_rows_arg(text):
    """`--rows "a,b,c"`: comma-separated names (blanks dropped)."""
    return [{'name': part.strip()} for part in text.split(',') if part.strip()]


def _csv_rows(path, delimiter):
    with open(path, newline='', encoding='utf-8-sig') as handle:
        lines = [line for line in csv.reader(handle, delimiter=delimiter)
                 if any(cell.strip() for cell in line)]
    if not lines:
        return []
    header = [cell.strip() for cell in lines[0]]
    if 'name' in (cell.lower() for cell in header):
        keys = [cell.lower() if cell.lower() == 'name' else cell for cell in header]
        rows = []
        for line in lines[1:]:
            row = {key: value for key, value in zip(keys, line) if key}
            if row.get('name', '').strip():
                rows.append(row)
        return rows
    return [{'name': line[0].strip()} for line in lines if line and line[0].strip()]


def read_rows_file(path):
    """Rows from a file (see the module docstring); ValueError when it holds none or is malformed."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in ('.csv', '.tsv'):
        rows = _csv_rows(path, '\t' if suffix == '.tsv' else ',')
    elif suffix == '.json':
        data = json.loads(path.read_text(encoding='utf-8'))
        if isinstance(data, dict):
            data = data.get('rows')
        if not isinstance(data, list):
            raise ValueError(f'{path}: expected a list of rows or {{"rows": [...]}}')
        rows = []
        for item in data:
            if isinstance(item, str):
                rows.append({'name': item})
            elif isinstance(item, dict) and isinstance(item.get('name'), str):
                rows.append(dict(item))
            else:
                raise ValueError(f'{path}: each row must be a string or an object with a "name" string')
    else:
        rows = [{'name': line.strip()} for line in path.read_text(encoding='utf-8').splitlines()
                if line.strip() and not line.lstrip().startswith('#')]
    if not rows:
        raise ValueError(f'{path}: no rows')
    return rows


def demo_rows(count, seed=None):
    """`count` lay-language symptom phrases from the built-in list (shuffled when `seed` is given)."""
    if count < 1:
        raise ValueError('count must be at least 1')
    phrases = list(PHRASES)
    if seed is not None:
        random.Random(seed).shuffle(phrases)
    return [{'name': phrases[i % len(phrases)]} for i in range(count)]


def write_output(path, report):
    """Write every row's outcome: `.csv` (one line per row) or JSON (rows and the summary)."""
    path = Path(path)
    if path.suffix.lower() == '.csv':
        with open(path, 'w', newline='', encoding='utf-8') as handle:
            writer = csv.writer(handle)
            writer.writerow(['index', 'name', 'status', 'code', 'concept_name', 'score', 'reason', 'task_id',
                             'idempotency_key'])
            for outcome in report.outcomes:
                code, name, score = candidate_fields(outcome.top) if outcome.top else ('', '', '')
                writer.writerow([outcome.index, outcome.name, outcome.status, code, name, score, outcome.reason or '',
                                 outcome.task_id or '', outcome.idempotency_key or ''])
        return
    body = {'summary': asdict(report.summary), 'rows': [outcome.as_dict() for outcome in report.outcomes]}
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + '\n', encoding='utf-8')
