"""A Run against the fake API, for the tests of the run's modules (run, jobs, sender, tally, retry,
concurrency)."""
from heavy_lanes_client import Run

SOURCE = '/orgs/HPO/sources/HPO/'
ROWS = ['chest pain', 'short of breath', 'pounding headache', 'dizzy when standing up', 'itchy rash']


def make_run(client, sleeps, rows=ROWS, **options):
    options.setdefault('batch_size', 2)
    options.setdefault('max_concurrency', 4)
    return Run.match(client, rows, SOURCE, semantic=True, sleep=sleeps, **options)


def keys_of(posts):
    return [post.headers['idempotency-key'] for post in posts]
