"""Flower's `/metrics` behind the same authentication as the rest of Flower.

Flower 2.2 serves its Prometheus metrics without asking for credentials even when basic auth or OAuth
protects everything else, and they name every worker and task. Flower has no option for it, so a Flower
process started through this app (`celery -A workers flower`) wraps that one handler in tornado's
`authenticated`: with basic auth a request without the credentials gets 401, like the API. Prometheus
scrapes it with the same credentials (deploy/prometheus/prometheus.yml).
"""
import tornado.web


def protect_metrics():
    from flower.views import monitor
    if not getattr(monitor.Metrics.get, 'heavy_lanes_protected', False):
        get = tornado.web.authenticated(monitor.Metrics.get)
        get.heavy_lanes_protected = True
        monitor.Metrics.get = get
