"""The API's JSON parser: DRF's, with two more ways a body can be unusable reported as 400, not 500.

- Nesting deeper than the interpreter's recursion limit (3,000 levels of `[`) made `json.load` raise
  RecursionError: it is a parse error here.
- JSON may carry lone surrogates (`"\\ud800"`): Python reads them into a str that can't be encoded as
  UTF-8, so the call was accepted and then every read of its row or result failed. A body with such a
  string is refused, naming where it is (`rows[0].name`).
"""
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 64  # far more than any body of this API has (a $rerank row's synonyms are depth 4)


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
    """(path, message) of the first string that isn't valid Unicode or the first value nested too deeply;
    None when the value is fine. Iterates by hand so a deep value can't exhaust the stack here either."""
    stack = [(value, path, depth)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path, f'Nested more than {MAX_DEPTH} levels deep.'
        if isinstance(value, str):
            if not _is_unicode(value):
                return path, 'Contains an unpaired surrogate: send valid Unicode text.'
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if not _is_unicode(key):
                    return path, 'A key contains an unpaired surrogate: send valid Unicode text.'
                stack.append((item, f'{path}.{key}' if path else key, depth + 1))
        elif isinstance(value, list):
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], f'{path}[{index}]', depth + 1))
    return None


def _is_unicode(text):
    try:
        text.encode('utf-8')
    except UnicodeEncodeError:
        return False
    return True
