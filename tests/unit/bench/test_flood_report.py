"""The flood benchmark's figures and targets (bench/flood_report.py): pure shaping of its samples."""
import pytest

from bench.flood_report import FIG_KEYS, Phase, detail, figure, percentile, tally, targets


@pytest.mark.parametrize(('values', 'q', 'expected'), [
    ([], 99, None),                       # no samples: no figure, not 0
    ([7.0], 99, 7.0),                     # one sample is every percentile
    ([3, 1, 2], 50, 2),                   # unsorted input
    (list(range(1, 101)), 99, 99),        # nearest rank: the 99th of 100
    (list(range(1, 101)), 100, 100),
    (list(range(1, 11)), 99, 10),         # fewer than 100 samples: the largest
])
def test_a_percentile_is_the_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected


def phase(seconds=10.0, lexical=(), single=(), healthz=(), run=(), rows=0, errors=0):
    return Phase(seconds=seconds, latency_ms={'lexical': list(lexical), 'single': list(single),
                                              'healthz': list(healthz)}, run_ms=list(run), bulk_rows=rows,
                 errors=errors)


def test_a_figure_has_the_issue_keys_and_reads_idle_from_the_idle_phase():
    idle = phase(lexical=[10, 20], healthz=[5])
    loaded = phase(seconds=20, lexical=[30, 40], single=[100, 300], healthz=[8], run=[50, 60], rows=400, errors=2)
    fig = figure(loaded, idle)
    assert tuple(fig) == FIG_KEYS
    assert fig == {'lexical_p99_ms': 40, 'lexical_idle_p99_ms': 20, 'single_p99_ms': 300, 'single_run_p99_ms': 60,
                   'healthz_p99_ms': 8, 'healthz_idle_p99_ms': 5, 'bulk_rows_per_s': 20.0, 'errors': 2}


def test_the_detail_lists_each_trickles_slowest_requests_with_when_they_were_sent():
    loaded = Phase(seconds=25)
    for ms, at in [(12.0, 0.5), (180.04, 7.25), (11.0, 1.0), (40.0, 20.0), (13.0, 24.5)]:
        loaded.add('lexical', ms, at)
    loaded.add('healthz', 5.0, 3.0)
    slowest = detail(loaded)['slowest']
    assert slowest == {'lexical': [[180.0, 7.2], [40.0, 20.0], [13.0, 24.5]], 'single': [], 'healthz': [[5.0, 3.0]]}
    assert loaded.p99('lexical') == 180.04 and detail(loaded)['lexical_n'] == 5


def fig(lexical=30, lexical_idle=20, single=200, run=50, healthz=10, healthz_idle=10, rows=100.0, errors=0):
    return {'lexical_p99_ms': lexical, 'lexical_idle_p99_ms': lexical_idle, 'single_p99_ms': single,
            'single_run_p99_ms': run, 'healthz_p99_ms': healthz, 'healthz_idle_p99_ms': healthz_idle,
            'bulk_rows_per_s': rows, 'errors': errors}


def test_targets_are_met_at_their_bounds_and_bulk_compares_with_the_in_request_best_at_any_n():
    in_request = {2: fig(rows=50.0), 8: fig(rows=200.0), 32: fig(rows=100.0)}
    heavy = {32: fig(rows=180.0)}  # 0.9 x 200: exactly the bound
    met = targets(in_request, heavy, 32)
    assert {name: line['met'] for name, line in met.items()} == {
        'lexical_p99_vs_idle': True, 'healthz_p99_vs_idle': True, 'single_p99_vs_run': True,
        'bulk_rows_per_s_vs_in_request_best': True, 'errors': True}
    assert met['single_p99_vs_run']['bound'] == 200  # 2 x 50 + 100
    assert met['bulk_rows_per_s_vs_in_request_best']['bound'] == 180.0


def test_a_target_over_its_bound_or_without_samples_is_not_met():
    heavy = {32: fig(lexical=31, single=201, healthz=None, rows=179.9, errors=1)}
    met = targets({2: fig(rows=200.0)}, heavy, 32)
    assert not any(line['met'] for line in met.values())


def test_the_tally_counts_the_rounds_that_met_each_target_with_each_rounds_value():
    rounds = [
        {'bulk': {'value': 467.2, 'bound': 493.9, 'met': False}, 'errors': {'value': 0, 'bound': 0, 'met': True}},
        {'bulk': {'value': 512.8, 'bound': 480.0, 'met': True}, 'errors': {'value': 0, 'bound': 0, 'met': True}},
        {'bulk': {'value': None, 'bound': 490.0, 'met': False}, 'errors': {'value': 2, 'bound': 0, 'met': False}},
    ]
    assert tally(rounds) == {
        'bulk': {'met': 1, 'rounds': 3, 'values': [467.2, 512.8, None], 'bounds': [493.9, 480.0, 490.0]},
        'errors': {'met': 2, 'rounds': 3, 'values': [0, 0, 2], 'bounds': [0, 0, 0]},
    }
    assert tally([]) == {}
