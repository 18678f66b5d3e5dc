"""The API's JSON parser: DRF's, with more ways a body can be unusable reported as 400, not 500 or 503.

- Nesting deeper than the interpreter's recursion limit (3,000 levels of `[`) made `json.load` raise
  RecursionError: it is a parse error here.
- JSON may carry lone surrogates (`"\\ud800"`): Python reads them into a str that can't be encoded as
  UTF-8, so the call was accepted and then every read of its row or result failed.
- JSON may carry NUL (`"\\u0000"`), which PostgreSQL can store neither in text nor in jsonb: the call's
  row failed to insert, and the answer said the queue was down (503).
- A number too large for a float (`1e400`) reads as infinity, which no JSON renderer or database takes:
  the answer was a 500 (with its debug page) once the number was echoed or stored.

A body with any of these, in a value or in a key, at any depth, is refused with a 400 naming where it is
(`rows[0].name`), before anything reads it: every endpoint's body is stored, echoed or both.
"""
import math

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 64  # far more than any body of this API has (a $rerank row's synonyms are depth 4)
SURROGATE = 'Contains an unpaired surrogate: send valid Unicode text.'
NUL = 'Contains a NUL character (\\u0000), which can not be stored: leave it out.'
OUT_OF_RANGE = 'A number out of range: at most about 1.8e308 either way.'


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError('JSON parse error - nested too deeply.') from None
        problem = find_problem(data)
        if problem is not None:
            path, message = problem
            raise ValidationError({path or 'body': [message]})
        return data


def find_problem(value, path='', depth=0):
    """(path, message) of the first value that can't be stored or echoed (see the module docstring) or is
    nested too deeply; None when the value is fine. Iterates by hand so a deep value can't exhaust the stack
    here either."""
    stack = [(value, path, depth)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path, f'Nested more than {MAX_DEPTH} levels deep.'
        if isinstance(value, str):
            if (problem := text_problem(value)) is not None:
                return path, problem
        elif isinstance(value, float):
            if not math.isfinite(value):
                return path, OUT_OF_RANGE
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if (problem := text_problem(key)) is not None:
                    return path, f'A key {problem[0].lower()}{problem[1:]}'
                stack.append((item, f'{path}.{key}' if path else key, depth + 1))
        elif isinstance(value, list):
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], f'{path}[{index}]', depth + 1))
    return None


def text_problem(text):
    """Why `text` can't be stored as it is (a message), or None."""
    if '\x00' in text:
        return NUL
    try:
        text.encode('utf-8')
    except UnicodeEncodeError:
        return SURROGATE
    return None
