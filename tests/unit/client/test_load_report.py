"""The load report: latency percentiles."""
from heavy_lanes_client.load_report import percentile


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99)) == (50, 90, 99)
    assert percentile([3.0], 0.99) == 3.0 and percentile([], 0.5) is None
