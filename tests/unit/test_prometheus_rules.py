"""deploy/prometheus/: Prometheus accepts the rules and the scrape config (promtool check), the alerts fire
as their unit tests say (promtool test rules), and every alert has a severity and a runbook section that
exists in docs/operations.md."""
import re
import subprocess
from pathlib import Path

import yaml

from tests.conftest import promtool

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / 'deploy' / 'prometheus'


def run(*args, cwd=PROMETHEUS):
    done = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    assert 'SUCCESS' in run('check', 'rules', 'rules.yml')
    assert 'SUCCESS' in run('test', 'rules', 'rules.test.yml')


def test_promtool_accepts_the_scrape_config(tmp_path):
    # The credential files it names must exist for promtool: point them at stand-ins.
    text = (PROMETHEUS / 'prometheus.yml').read_text().replace('/etc/prometheus/', f'{tmp_path}/')
    for name in ('heavy-lanes-metrics-token', 'heavy-lanes-flower-password'):
        (tmp_path / name).write_text('secret\n')
    (tmp_path / 'prometheus.yml').write_text(text)
    (tmp_path / 'rules.yml').write_text((PROMETHEUS / 'rules.yml').read_text())
    assert 'SUCCESS' in run('check', 'config', 'prometheus.yml', cwd=tmp_path)
    jobs = {job['job_name'] for job in yaml.safe_load(text)['scrape_configs']}
    assert jobs == {'heavy-lanes-api', 'heavy-lanes-flower'}


def anchors(markdown):
    """GitHub's anchors of a page's headings."""
    return {re.sub(r'[^a-z0-9 _-]', '', line.lstrip('#').strip().lower()).replace(' ', '-')
            for line in markdown.splitlines() if line.startswith('#')}


def test_every_alert_has_a_severity_and_a_runbook_section_in_operations_md():
    groups = yaml.safe_load((PROMETHEUS / 'rules.yml').read_text())['groups']
    alerts = [rule for group in groups for rule in group['rules'] if 'alert' in rule]
    sections = anchors((ROOT / 'docs' / 'operations.md').read_text())
    assert len(alerts) >= 7
    for alert in alerts:
        assert alert['labels']['severity'] in ('critical', 'warning'), alert['alert']
        page, anchor = alert['annotations']['runbook_url'].split('#')
        assert page == 'docs/operations.md' and anchor in sections, alert['alert']
