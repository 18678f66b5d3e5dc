"""The RateLimit fields are Structured Field lists any RFC 9651 parser reads back as what was meant."""
import http_sf

from common.ratelimit import CONCURRENT, Quota, fields


def parsed(text):
    """[(name, {param: value})] of one field's list, by the reference parser."""
    return [(name, dict(params)) for name, params in http_sf.parse(text.encode(), tltype='list')]


def test_concurrency_and_rate_quotas_render_as_policy_and_service_limit_items():
    headers = fields([
        Quota('es2_knn', 2, CONCURRENT, remaining=0, reset=3),
        Quota('tier', 3, CONCURRENT, partition='preview', remaining=2),
        Quota('rate', 600, window=60, remaining=598, reset=41),
    ])
    assert parsed(headers['RateLimit-Policy']) == [
        ('es2_knn', {'q': 2, 'qu': 'concurrent-requests'}),
        ('tier', {'q': 3, 'qu': 'concurrent-requests', 'pk': b'preview'}),
        ('rate', {'q': 600, 'w': 60}),  # "requests" is the default unit: left out
    ]
    assert parsed(headers['RateLimit']) == [
        ('es2_knn', {'r': 0, 't': 3}), ('tier', {'r': 2, 'pk': b'preview'}), ('rate', {'r': 598, 't': 41})]


def test_an_uncounted_quota_has_a_policy_but_no_service_limit_and_nothing_renders_nothing():
    assert fields([Quota('user', 1, CONCURRENT)]) == {
        'RateLimit-Policy': '"user";q=1;qu="concurrent-requests"'}
    assert fields([None]) == {} and fields([]) == {}


def test_what_is_left_is_never_negative():
    # A shadow-refused call is counted past the limit; the field says 0 left, not -1.
    assert parsed(fields([Quota('user', 1, CONCURRENT, remaining=-1, reset=2)])['RateLimit']) == [
        ('user', {'r': 0, 't': 2})]
