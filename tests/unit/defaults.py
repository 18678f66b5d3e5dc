"""The capacity config's defaults with some values changed, for the pure policy tests."""
import copy

from capacity.constants import DEFAULTS


def config(**changes):
    """DEFAULTS with `changes`; a dict value is merged into that section."""
    merged = copy.deepcopy(DEFAULTS)
    for key, value in changes.items():
        if isinstance(value, dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return merged
