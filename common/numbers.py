"""Whole numbers as clients write them in a query string: ASCII digits and nothing else.

    whole_number('42')      # 42
    whole_number('²')       # None: a digit to str.isdigit, which int() refuses (a 500 where it was trusted)
    whole_number('٣')       # None: a decimal digit to str.isdecimal and int(), but not what the API documents
    whole_number('1_000')   # None: int() reads it as 1000
    whole_number('9' * 20)  # None: longer than `max_digits` (int() refuses over 4300 digits)

Every query parameter the API reads as a number goes through here, so each one is total: a number, or a
400 naming the parameter (the caller's), never a 500 and never a number nobody wrote.
"""
MAX_DIGITS = 9  # below 10**9: wider than any count, page or number of seconds the API takes


def whole_number(text, max_digits=MAX_DIGITS):
    """`text` as a non-negative int when it is 1 to `max_digits` ASCII digits, else None. Never raises."""
    if not isinstance(text, str) or not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
