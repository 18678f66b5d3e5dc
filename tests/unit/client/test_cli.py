"""The command line: rows in, outcomes and the summary out, exit codes, Ctrl-C."""
import csv
import io
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from heavy_lanes_client import Run
from heavy_lanes_client.cli import main
from heavy_lanes_client.progress import Progress
from heavy_lanes_client.rows import demo_rows, parse_rows_arg, read_rows_file
from tests.unit.client.fake_api import Refuse

SOURCE = '/orgs/HPO/sources/HPO/'
REPO = Path(__file__).resolve().parents[3]


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_match_writes_every_row_to_the_output_file_and_prints_the_summary(api, tmp_path):
    rows = tmp_path / 'rows.csv'
    rows.write_text('id,name\n1,chest pain\n2,itchy rash\n3,fever\n', encoding='utf-8')
    api.no_match = {'fever'}
    api.script.append(Refuse(retry_after=0))
    output = tmp_path / 'results.json'

    code, out, err = run_cli('match', '--url', api.url, '--token', 't-core', '--source', SOURCE, '--semantic',
                             '--rows-file', str(rows), '--batch', '2', '--output', str(output),
                             '--no-progress')

    assert code == 0
    written = json.loads(output.read_text())
    assert [(row['name'], row['status']) for row in written['rows']] == [
        ('chest pain', 'matched'), ('itchy rash', 'matched'), ('fever', 'no_match')]
    assert written['summary']['refused_capacity'] == 1
    assert {row['id'] for post in api.posts() for row in post.body['rows']} == {'1', '2', '3'}
    assert 'Summary: $match (semantic)' in out
    assert re.search(r'^  refused: capacity \(429\) +1$', out, re.MULTILINE)
    assert re.search(r'^  no match +1$', out, re.MULTILINE)
    assert 'Wrote 3 rows' in err


def test_a_failed_row_makes_the_exit_code_1_and_its_reason_is_written(api, tmp_path):
    api.final_states.extend(['failed'])
    output = tmp_path / 'results.csv'

    code, out, _ = run_cli('match', '--url', api.url, '--token', 't-core', '--source', SOURCE, '--semantic',
                           '--rows', 'chest pain', '--output', str(output), '--no-progress')

    assert code == 1
    (row,) = list(csv.DictReader(io.StringIO(output.read_text(encoding='utf-8'))))
    assert row['status'] == 'failed' and row['reason'].startswith('task failed')
    assert 'Failed rows by reason:' in out


def test_without_an_output_file_the_rows_are_printed(api):
    code, out, _ = run_cli('match', '--url', api.url, '--token', 't-core', '--source', SOURCE, '--semantic',
                           '--demo-rows', '3', '--no-progress')

    assert code == 0
    assert 'pounding headache' in out and 'matched' in out


def test_a_missing_token_is_a_usage_error(api, monkeypatch):
    monkeypatch.delenv('HEAVY_LANES_TOKEN', raising=False)
    with pytest.raises(SystemExit) as ex:
        run_cli('match', '--url', api.url, '--source', SOURCE, '--rows', 'a')
    assert ex.value.code == 2


def test_sources_are_listed(api):
    code, out, _ = run_cli('sources', '--url', api.url, '--token', 't-core')
    assert code == 0 and '/orgs/HPO/sources/HPO/' in out and '42' in out


def test_the_progress_line_shows_rows_done_failed_and_waiting(api, client):
    api.final_states.extend(['failed'])
    stream = io.StringIO()
    progress = Progress('match', stream=stream, tty=False)
    run = Run.match(client, ['a', 'b', 'c'], SOURCE, batch_size=1, progress=progress)

    run.execute()

    last = stream.getvalue().strip().splitlines()[-1]
    assert last.startswith('match [########################] 3/3 rows')
    assert 'matched 2  no match 0  failed 1' in last and 'waiting for capacity 0' in last


def test_the_progress_line_shows_the_rows_the_server_has_done_in_running_calls(api, client):
    api.hold_tasks, api.rows_done, api.long_poll_cap = True, 3, 0  # each running call of 4 rows: 3 done
    stream = io.StringIO()
    progress = Progress('match', stream=stream, tty=False, log_interval=0.02)
    run = Run.match(client, ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'], SOURCE, batch_size=4, progress=progress)
    thread = threading.Thread(target=run.execute)
    thread.start()
    try:
        assert api.wait_for(lambda _: '(+6 running)' in stream.getvalue(), timeout=10), stream.getvalue()
    finally:
        run.cancel()
        thread.join(10)
    line = next(text for text in stream.getvalue().splitlines() if '(+6 running)' in text)
    assert line.startswith('match [' + '+' * 18 + '-' * 6 + '] 0/8 rows (+6 running) |')


@pytest.mark.slow
def test_ctrl_c_cancels_the_tasks_in_flight_prints_the_summary_and_exits_130(api):
    api.suggested = 3
    api.hold_tasks = True
    command = [sys.executable, '-m', 'heavy_lanes_client', 'match', '--url', api.url, '--token', 't-core',
               '--source', SOURCE, '--semantic', '--rows', 'a,b,c,d,e', '--batch', '1', '--no-progress']
    # Ctrl-C in a terminal: the client starts with SIGINT at its default, whatever this test process has it
    # at (a child inherits SIG_IGN, and Python then never raises KeyboardInterrupt: in CI an earlier test had
    # left it ignored, and the client ran on until killed).
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert api.wait_for(lambda fake: len(fake.tasks) == 3, timeout=15)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 130, err
    assert sorted(seen.path.split('/')[2] for seen in api.requests('DELETE')) == sorted(api.tasks)
    assert all(task.state == 'cancelled' for task in api.tasks.values())
    assert len(api.posts()) == 3
    assert 'interrupted: tasks in flight were cancelled' in out
    assert re.findall(r'^\d  ([a-e])    failed  (.*)$', out, re.MULTILINE) == [
        (name, 'cancelled: run interrupted') for name in 'abc'] + [
        (name, 'not submitted: run interrupted') for name in 'de']
    assert re.search(r'^ +3  cancelled: run interrupted$', out, re.MULTILINE)


def test_rows_come_from_csv_tsv_json_text_and_the_command_line(tmp_path):
    (tmp_path / 'named.csv').write_text('code,Name\nX1,chest pain\nX2,\nX3,fever\n', encoding='utf-8')
    (tmp_path / 'plain.csv').write_text('chest pain,extra\nfever\n', encoding='utf-8')
    (tmp_path / 'rows.tsv').write_text('name\tid\nchest pain\t7\n', encoding='utf-8')
    (tmp_path / 'rows.json').write_text(json.dumps({'rows': ['fever', {'name': 'rash', 'id': 2}]}),
                                        encoding='utf-8')
    (tmp_path / 'rows.txt').write_text('# symptoms\nfever\n\nchills\n', encoding='utf-8')

    assert read_rows_file(tmp_path / 'named.csv') == [{'code': 'X1', 'name': 'chest pain'},
                                                      {'code': 'X3', 'name': 'fever'}]
    assert read_rows_file(tmp_path / 'plain.csv') == [{'name': 'chest pain'}, {'name': 'fever'}]
    assert read_rows_file(tmp_path / 'rows.tsv') == [{'name': 'chest pain', 'id': '7'}]
    assert read_rows_file(tmp_path / 'rows.json') == [{'name': 'fever'}, {'name': 'rash', 'id': 2}]
    assert read_rows_file(tmp_path / 'rows.txt') == [{'name': 'fever'}, {'name': 'chills'}]
    assert parse_rows_arg('a, b,,c') == [{'name': 'a'}, {'name': 'b'}, {'name': 'c'}]
    assert len(demo_rows(250)) == 250 and demo_rows(2, seed=1) == demo_rows(2, seed=1)
