"""The table printed at the end of a run: rows by outcome, calls by answer, waits and wall time."""
from collections import Counter

from heavy_lanes_client.models import RowStatus

MAX_REASONS = 5


def table(rows, headers=None, align=None):
    """Plain-text columns. `align` has one letter per column, `l` or `r`; default: the first column left,
    the others right."""
    rows = [[str(cell) for cell in row] for row in rows]
    if headers:
        rows.insert(0, [str(cell) for cell in headers])
    if not rows:
        return ''
    count = len(rows[0])
    align = align or 'l' + 'r' * (count - 1)
    widths = [max(len(row[i]) for row in rows) for i in range(count)]
    lines = []
    for number, row in enumerate(rows):
        cells = [cell.ljust(width) if side == 'l' else cell.rjust(width)
                 for cell, width, side in zip(row, widths, align)]
        lines.append('  '.join(cells).rstrip())
        if headers and number == 0:
            lines.append('  '.join('-' * width for width in widths))
    return '\n'.join(lines)


def format_summary(report, label=None):
    s = report.summary
    title = f'Summary: {label or s.endpoint}' + (' (interrupted: tasks in flight were cancelled)'
                                                  if s.interrupted else '')
    rows = [
        ('rows', s.rows),
        ('  matched', s.matched),
        ('  no match', s.no_match),
        ('  failed', s.failed),
        ('calls (batches)', s.batches),
        ('  sends, retries included', s.submissions),
        ('  admitted (202/200)', s.admitted),
        ('  of which shadow-refused', s.shadow_refused),
        ('  refused: capacity (429)', s.refused_capacity),
        ('  refused: rate limit (429)', s.rate_limited),
        ('  server errors (5xx)', s.server_errors),
        ('  no answer (connection)', s.connection_errors),
        ('  rejected (other 4xx)', s.rejected),
        ('tasks failed', s.tasks_failed),
        ('tasks expired', s.tasks_expired),
        ('tasks cancelled', s.tasks_cancelled),
        ('most calls in flight', s.max_in_flight),
        ('waited for capacity', f'{s.capacity_wait_seconds:.1f} s'),
        ('wall time', f'{s.wall_seconds:.1f} s'),
    ]
    text = [title, table(rows)]
    reasons = Counter(outcome.reason for outcome in report.outcomes if outcome.status == RowStatus.FAILED)
    if reasons:
        text.append('Failed rows by reason:')
        for reason, count in reasons.most_common(MAX_REASONS):
            text.append(f'  {count:>6}  {reason}')
        if len(reasons) > MAX_REASONS:
            text.append(f'  ... and {len(reasons) - MAX_REASONS} other reasons (see the output file)')
    return '\n'.join(text)
