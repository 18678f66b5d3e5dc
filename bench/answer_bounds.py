"""The answer bounds on HPO: for a few `$match` bodies, whether validation admits them under the default
bounds (concepts.bounds), the byte estimate, and the size of the lexical answer actually rendered.

    .venv/bin/python bench/answer_bounds.py [--var-dir var]

Reads the database of `make run` in `--var-dir` (HPO must be loaded: `make run` loads it). The figures of
docs/api.md, "Answer bounds", come from this script. The rendered answer is the lexical match's, run in this
process: a semantic or reranked one holds the same number of candidates of the same shape.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HPO = '/orgs/HPO/sources/HPO/'
CASES = [(1000, {'limit': '100', 'verbose': 'true'}), (1000, {'limit': '10', 'verbose': 'true'}),
         (1000, {'limit': '10'}), (1000, {'limit': '5', 'verbose': 'true'}), (100, {'limit': '100'}),
         (50, {'limit': '1'})]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--var-dir', default='var')
    args = parser.parse_args()
    os.environ['HEAVY_LANES_VAR_DIR'] = str(Path(args.var_dir).resolve())
    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')
    import django
    django.setup()
    from django.conf import settings
    from rest_framework.exceptions import ValidationError
    from rest_framework.renderers import JSONRenderer

    from concepts import bounds, services
    from concepts.models import Source

    started = time.monotonic()
    sizes = bounds.candidate_sizes(Source.objects.get(mnemonic='HPO'))
    print(f'HPO: {sizes.concepts} concepts, largest candidate {sizes.plain} B plain, {sizes.verbose} B verbose '
          f'(measured in {time.monotonic() - started:.1f} s); bounds MAX_MATCH_CANDIDATES '
          f'{settings.MAX_MATCH_CANDIDATES}, MAX_ANSWER_BYTES {settings.MAX_ANSWER_BYTES}')
    rows = [{'name': f'high blood pressure with chest pain and fever, case {i}'} for i in range(1000)]
    for count, query in CASES:
        body = {'rows': rows[:count], 'target_repo_url': HPO}
        label = f'{count} rows, ' + '&'.join(f'{k}={v}' for k, v in query.items())
        checked = {'MAX_MATCH_CANDIDATES': settings.MAX_MATCH_CANDIDATES, 'MAX_ANSWER_BYTES': settings.MAX_ANSWER_BYTES}
        try:
            settings.MAX_MATCH_CANDIDATES = settings.MAX_ANSWER_BYTES = 10 ** 12  # to estimate every case
            payload = services.validate_match(body, query)
            estimate = bounds.match_answer_bytes(payload['body'], payload['params'], sizes)
        finally:
            settings.MAX_MATCH_CANDIDATES, settings.MAX_ANSWER_BYTES = checked.values()
        try:
            services.validate_match(body, query)
            verdict = 'admitted'
        except ValidationError as ex:
            verdict = 'refused: ' + ('MAX_MATCH_CANDIDATES' if 'CANDIDATES' in str(ex.detail) else 'MAX_ANSWER_BYTES')
        answer = JSONRenderer().render(services.run_match(payload, semantic=False, reranker=False))
        print(f'{label}: {verdict}; estimate {estimate / 1e6:.2f} MB, rendered {len(answer) / 1e6:.2f} MB')


if __name__ == '__main__':
    main()
