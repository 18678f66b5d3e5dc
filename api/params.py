"""Query parameters read as whole numbers: ASCII digits in a range, else a 400 naming the parameter.

    page = whole_param(request, 'page', low=1)                      # None when absent
    wait = whole_param(request, 'wait', default=0, high=None)        # a default when absent
"""
from rest_framework.exceptions import ValidationError

from common.numbers import whole_number


def whole_param(request, name, default=None, low=0, high=None):
    """The query parameter `name` as an int from `low` to `high` (None: no top), `default` when it is absent
    or empty; any other text (a sign, a space, a digit outside ASCII: '²', '٣') is a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None or raw == '':
        return default
    value = whole_number(raw)
    if value is None or value < low or (high is not None and value > high):
        bound = f'from {low} to {high}' if high is not None else f'of {low} or more'
        raise ValidationError({name: [f'Must be a whole number {bound}, in ASCII digits.']})
    return value
