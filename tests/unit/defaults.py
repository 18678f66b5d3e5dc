"""The capacity config's defaults with some values changed, for the pure policy tests."""
import copy

from capacity.defaults import DEFAULTS, Config


def config(**changes):
    """The Config of DEFAULTS with `changes`; a dict value is merged into that section."""
    merged = copy.deepcopy(DEFAULTS)
    for key, value in changes.items():
        if isinstance(value, dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return Config.from_json(merged)
