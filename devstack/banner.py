"""What `make run` prints once everything is ready: the URLs, the demo tokens, Flower's credentials and
commands to try, with the HPO source read back from the running API."""
import json
import socket

from devstack.files import read_private
from devstack.processes import http_get
from devstack.redis_server import masked
from workers.lanes import QUEUE_NAMES

DEFAULT_SOURCE = '/orgs/HPO/sources/HPO/'


def loaded_source(api_url, token):
    """(url, description) of the loaded HPO source, read back through GET /sources/."""
    status, body = http_get(f'{api_url}/sources/', {'Authorization': f'Token {token}'}, timeout=5)
    if status == 200:
        try:
            sources = json.loads(body)
            chosen = next((s for s in sources if s.get('mnemonic') == 'HPO'), sources[0] if sources else None)
        except (ValueError, AttributeError, TypeError):
            chosen = None
        if chosen:
            return chosen['url'], (f'{chosen.get("name")} version {chosen.get("version")}, '
                                   f'{chosen.get("concept_count")} concepts')
    return DEFAULT_SOURCE, f'(GET /sources/ answered {status or "nothing"}; assumed)'


def banner(*, var, logs, api_url, flower_url, flower_auth, redis_url, redis_kind, seconds, building=()):
    """The lines to print; `seconds` is how long the start took; `building`: the sources whose semantic index
    is built after the banner (the lane workers start once it is)."""
    tokens = read_private(var / 'demo-tokens.json') or {'tokens': []}
    by_tier = {row['tier']: row for row in tokens['tokens']}
    core = by_tier.get('core', {}).get('token', '<token>')
    source_url, source_text = loaded_source(api_url, core)
    user, password = flower_auth.split(':', 1)
    hostname = socket.gethostname()
    workers = ', '.join(f'{queue}@{hostname}' for queue in QUEUE_NAMES)
    if building:
        workers_lines = [
            f'  Indexes   semantic index of {", ".join(building)}: building now (minutes on 2 cores), its progress in',
            f'            {logs / "indexes.log"} and on the lanes page; semantic and reranked calls are accepted',
            '            and wait in their queues until it is built',
            f'  Workers   {workers} (start once the index is built; pools sized from the capacity config)',
        ]
    else:
        workers_lines = [f'  Workers   {workers} (pools sized from the capacity config)']
    return [
        '',
        f'Heavy Lanes is running (ready in {seconds:.1f} s). Ctrl-C stops everything.',
        '',
        f'  API       {api_url}/            health {api_url}/healthz',
        f'  Schema    {api_url}/schema/    interactive: {api_url}/schema/docs/',
        f'  Lanes     {api_url}/capacity/dashboard/    admin {api_url}/admin/',
        '            (staff log in with a password: .venv/bin/python manage.py changepassword demo-staff)',
        f'  Sources   {api_url}/sources/    {source_url}  {source_text}',
        f'  Flower    {flower_url}/    user {user}  password {password}',
        f'  Redis     {masked(redis_url)}  ({redis_kind})',
        *workers_lines,
        f'  Beat      the sweep and retention, run by maintenance@{hostname}',
        f'  Logs      {logs}/',
        '',
        f'Demo users (tokens also in {var / "demo-tokens.json"}):',
        *(f'  {row["username"]:<13} {row["tier"]:<13} {row["token"]}' for row in tokens['tokens']),
        '',
        'Try:',
        f'  curl -H "Authorization: Token {core}" {api_url}/sources/',
        f'  .venv/bin/python -m heavy_lanes_client match --url {api_url} --token {core} '
        f'--source {source_url} --semantic --demo-rows 50',
        f'  .venv/bin/python -m heavy_lanes_client load --url {api_url} '
        f'--tokens {var / "demo-tokens.json"} --staff-token {tokens.get("staff_token", "<token>")} '
        f'--seconds 30',
        '',
    ]
