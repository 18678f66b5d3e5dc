"""The OpenAPI schema is generated from the code without errors, and docs/openapi.yaml is up to date."""
import os

import yaml
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
    with open(os.path.join(ROOT, 'docs', 'openapi.yaml')) as committed:
        assert committed.read() == generated.read_text(), (
            'docs/openapi.yaml is stale: .venv/bin/python manage.py spectacular --file docs/openapi.yaml')
