"""GET /metrics: Prometheus text, built at scrape time from shared state.

Everything here is read from Redis and the database when Prometheus scrapes, not kept in process memory,
so the numbers are the cluster's whatever API or worker process serves the scrape: lanes (in-flight and
limits), queues (depth, oldest waiting, consumers, pool sizes), counters kept in Redis (decisions, full
lanes, failed renewals, leases that expired without a release, calls that ended), and the calls still
open (queued or running) from their rows: a count bounded by the lanes' limits and the queue deadline, not
by the table's size.
"""
from django.db.models import Count
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from capacity import counters
from capacity.config import get_config
from capacity.constants import TIERS
from capacity.decisions import bulk_limit
from capacity.status import get_status
from workers.models import OPEN_STATES, Call

PREFIX = 'heavy_lanes'


def gauge(name, doc, labels=()):
    return GaugeMetricFamily(f'{PREFIX}_{name}', doc, labels=list(labels))


def counter(name, doc, labels=()):
    return CounterMetricFamily(f'{PREFIX}_{name}', doc, labels=list(labels))


class HeavyLanesCollector:
    def collect(self):
        config = get_config()
        status = get_status(config)
        redis_up = gauge('redis_up', 'Whether the lanes Redis answered this scrape (1) or not (0).')
        redis_up.add_metric([], 1 if status.get('redis') == 'ok' else 0)
        yield redis_up
        mode = gauge('mode', 'The capacity mode in force (1 for the current one).', ['mode'])
        for name in ('off', 'shadow', 'enforce'):
            mode.add_metric([name], 1 if config.mode == name else 0)
        yield mode
        yield from self.lanes(status, config)
        yield from self.queues(status.get('queues', {}))
        yield from self.counted(status)

    def lanes(self, status, config):
        in_flight = gauge('lane_in_flight', 'Unexpired leases in a lane (queued and running calls).', ['lane'])
        limit = gauge('lane_limit', 'A lane\'s limit (for bulk calls: limit less the single-row reserve).',
                      ['lane', 'kind'])
        if status.get('redis') == 'ok':
            for lane in ('api_heavy', 'es2_knn'):
                in_flight.add_metric([lane], status[lane]['in_flight'])
            for tier, entry in status['tiers'].items():
                in_flight.add_metric([f'tier:{tier}'], entry['in_flight'])
        for lane, value in (('api_heavy', config.api_heavy.cluster), ('es2_knn', config.es2_knn)):
            limit.add_metric([lane, 'all'], value)
            limit.add_metric([lane, 'bulk'], bulk_limit(value, config))
        for tier in TIERS:
            limit.add_metric([f'tier:{tier}', 'all'], config.tiers[tier])
        yield in_flight
        yield limit

    def queues(self, queues):
        families = {
            'depth': gauge('queue_depth', 'Messages waiting in a lane\'s queue (all priority levels).', ['queue']),
            'oldest_waiting_seconds': gauge('queue_oldest_waiting_seconds',
                                            'Age of the oldest call still queued.', ['queue']),
            'consumers': gauge('queue_consumers', 'Live worker nodes consuming the queue.', ['queue']),
            'pool': gauge('queue_pool_processes', 'Pool processes of the nodes consuming the queue.', ['queue']),
            'configured_pool': gauge('queue_pool_configured', 'Pool size the config asks for.', ['queue']),
        }
        for name, entry in queues.items():
            for key, family in families.items():
                if entry.get(key) is not None:
                    family.add_metric([name], entry[key])
        yield from families.values()

    def counted(self, status):
        decisions = counter('decisions', 'Gated calls by queue, tier and decision.', ['queue', 'tier', 'decision'])
        full = counter('full_lanes', 'Lanes found full, by lane, tier and decision (shadow-refused: would '
                                     'have refused).', ['lane', 'tier', 'decision'])
        renewals = counter('lease_renewals_failed', 'Lease renewals that failed or found a lease gone.')
        finished = counter('calls_finished', 'Calls that ended, by queue and final state.',
                           ['queue', 'state'])
        served = counter('calls_served', 'Calls by queue and how they were served: run (their own work), '
                                         'coalesced (joined an identical call\'s work), cached (an identical '
                                         'call\'s stored result).', ['queue', 'served_as'])
        expired = counter('leases_expired', 'Leases pruned after expiring without a release.')
        values = counters.read()  # {} when Redis can't say: redis_up says why the rest is missing
        for labels, value in sorted(values.items()):
            kind, rest = labels[0], list(labels[1:])
            if kind == 'decision' and len(rest) == 3:
                decisions.add_metric(rest, value)
            elif kind == 'full' and len(rest) == 3:
                full.add_metric(rest, value)
            elif kind == 'finished' and len(rest) == 2:
                finished.add_metric(rest, value)
            elif kind == 'served' and len(rest) == 2:
                served.add_metric(rest, value)
        renewals.add_metric([], values.get(('renewal_failed',), 0))
        if 'leases_expired_total' in status:
            expired.add_metric([], status['leases_expired_total'])
        yield from (decisions, full, renewals, expired, finished, served)
        yield self.open_calls()

    def open_calls(self):
        open_calls = gauge('calls_open', 'Calls queued or running, by queue and state.', ['queue', 'state'])
        rows = Call.objects.filter(work__state__in=OPEN_STATES, cancelled_at__isnull=True).values(
            'work__queue', 'work__state').annotate(n=Count('id')).order_by('work__queue', 'work__state')
        for row in rows:
            open_calls.add_metric([row['work__queue'], row['work__state']], row['n'])
        return open_calls


def render():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HeavyLanesCollector())
    return generate_latest(registry)
