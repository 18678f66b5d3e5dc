"""OpenAPI post-processing: keep the `$` of `/concepts/$match/` and `/concepts/$rerank/`.

The schema generator reads paths as regexes and drops `$` as an end-of-line anchor; these routes are plain
paths where `$` is part of the name (the FHIR-style operation names clients already use).
"""
from django.urls import get_resolver


def dollar_routes():
    """{path as the generator writes it: path as routed} for every route with a `$` in its name."""
    routes = {}
    for pattern in get_resolver().url_patterns:
        route = str(pattern.pattern)
        if '$' in route:
            routes['/' + route.replace('$', '')] = '/' + route
    return routes


def restore_dollar_paths(result, generator, request, public):
    renamed = dollar_routes()
    result['paths'] = {renamed.get(path, path): item for path, item in result['paths'].items()}
    return result
