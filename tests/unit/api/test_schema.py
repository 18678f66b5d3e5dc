"""The OpenAPI schema is generated from the code without errors, declares the headers clients act on, and
docs/openapi.yaml is up to date; the interactive page (Swagger UI) is served from this service's own files."""
import os
import re

import yaml
from django.contrib.staticfiles import finders
from django.core.management import call_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_the_schema_describes_the_heavy_calls_and_docs_openapi_yaml_is_current(tmp_path, db):
    generated = tmp_path / 'openapi.yaml'
    call_command('spectacular', '--validate', '--fail-on-warn', '--file', str(generated))
    schema = yaml.safe_load(generated.read_text())
    match = schema['paths']['/concepts/$match/']['post']
    assert {'200', '202', '400', '422', '429', '503'} <= set(match['responses'])
    assert {'Idempotency-Key', 'Prefer', 'X-OCL-Event-Metadata'} <= {p['name'] for p in match['parameters']}
    assert {'get', 'delete'} <= set(schema['paths']['/tasks/{call_id}/'])
    capacity = {'X-OCL-Capacity-Decision', 'X-OCL-Capacity-Limit', 'X-OCL-Capacity-In-Flight',
                'X-OCL-Capacity-Tier', 'X-OCL-Capacity-Tier-Limit', 'X-OCL-Capacity-Tier-In-Flight',
                'X-OCL-Capacity-Suggested-Concurrency', 'RateLimit', 'RateLimit-Policy'}
    for path in ('/concepts/$match/', '/concepts/$rerank/'):
        responses = schema['paths'][path]['post']['responses']
        headers = {code: set(responses[code].get('headers', {})) for code in responses}
        assert {'Location', 'Retry-After', 'Preference-Applied'} | capacity <= headers['202'], path
        assert {'Content-Location', 'Preference-Applied'} | capacity <= headers['200'], path
        assert {'Retry-After'} | capacity <= headers['429'], path
        assert 'Retry-After' in headers['503'], path
    assert 'num_returned' in match['responses']['200']['headers']
    assert 'Retry-After' in schema['paths']['/tasks/{call_id}/']['get']['responses']['200']['headers']
    retry = schema['paths']['/tasks/{call_id}/retry/']['post']['responses']
    assert {'Location', 'Retry-After'} | capacity <= set(retry['202']['headers']) and '409' in retry
    assert {'Retry-After'} | capacity <= set(retry['429']['headers'])
    listed = schema['paths']['/tasks/']
    assert {'state', 'endpoint', 'run', 'user', 'page', 'page_size'} <= {p['name'] for p in listed['get']['parameters']}
    assert 'run' in {p['name'] for p in listed['delete']['parameters']}
    task = schema['components']['schemas']['Task']['properties']
    assert {'rows_done', 'rows_total'} <= set(schema['components']['schemas']['TaskProgress']['properties'])
    assert 'progress' in task and 'progress' in schema['components']['schemas']['TaskSummary']['properties']
    assert 'Retry-After' in schema['paths']['/readyz']['get']['responses']['503']['headers']
    with open(os.path.join(ROOT, 'docs', 'openapi.yaml')) as committed:
        assert committed.read() == generated.read_text(), (
            'docs/openapi.yaml is stale: .venv/bin/python manage.py spectacular --file docs/openapi.yaml')


def test_the_interactive_api_page_loads_swagger_ui_from_this_service(client):
    page = client.get('/schema/docs/')
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(asset.endswith('swagger-ui-bundle.js') for asset in assets)
    assert all(asset.startswith('/static/drf_spectacular_sidecar/') for asset in assets), assets
    assert '/schema/' in html  # the schema it shows
    for asset in assets:  # each one is a file this service has (collectstatic gathers it for the proxy)
        assert finders.find(asset.removeprefix('/static/')), asset
