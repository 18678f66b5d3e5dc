"""Whole numbers in a query string: ASCII digits and nothing else (common.numbers)."""
import pytest

from common.numbers import whole_number


@pytest.mark.parametrize('text, expected', [
    ('0', 0),
    ('42', 42),
    ('007', 7),
    ('999999999', 999_999_999),  # nine digits: the most it reads
    ('1000000000', None),        # ten
    ('9' * 5000, None),          # int() itself fails past 4300 digits
    ('²', None),                 # a digit to str.isdigit; int() raises
    ('①', None),
    ('٣', None),                 # Arabic-Indic three: int() reads 3
    ('３', None),                 # fullwidth three: int() reads 3
    ('1_000', None),             # int() reads 1000
    (' 4', None),                # int() strips the space
    ('4 ', None),
    ('+4', None),
    ('-4', None),
    ('4.0', None),
    ('', None),
    (None, None),
    (4, None),                   # not text
])
def test_only_ascii_digits_read_as_a_whole_number(text, expected):
    assert whole_number(text) == expected
