"""What one call costs the Redis primary, measured on the cluster before any fault: the commands it
processed and the CPU it used (INFO stats and cpu) over a spell of load, less what the same spell costs
idle (the nodes' heartbeats and reconciles, beat, the sweep, the consumers' blocking reads), divided by the
calls that ran in it. docs/deployment.md's "Scaling on paper" divides from these."""
import time


def primary_counters(client):
    stats, cpu = client.info('stats'), client.info('cpu')
    return (int(stats['total_commands_processed']),
            float(cpu['used_cpu_sys']) + float(cpu['used_cpu_user']), time.monotonic())


def spell(client, seconds, during=None):
    """(commands, cpu seconds, seconds) on the primary over `seconds`, with `during` running meanwhile."""
    before = primary_counters(client)
    if during is not None:
        during(seconds)
    else:
        time.sleep(seconds)
    after = primary_counters(client)
    return tuple(b - a for a, b in zip(before, after))


def per_call(client, load, calls_ran, seconds=20, idle_seconds=10):
    """{figure: value} of a spell of `load` against an idle spell; `calls_ran(since)` counts the works that ran
    to an end since a time.time()."""
    idle = spell(client, idle_seconds)
    began = time.time()

    def loaded(length):
        load.start()
        time.sleep(length)
        load.stop()
    busy = spell(client, seconds, loaded)
    time.sleep(3)
    ran = calls_ran(began)
    idle_rate = (idle[0] / idle[2], idle[1] / idle[2])
    commands = busy[0] - idle_rate[0] * busy[2]
    cpu = busy[1] - idle_rate[1] * busy[2]
    return {'calls': ran, 'seconds': round(busy[2], 1), 'idle commands/s': round(idle_rate[0], 1),
            'commands per call': round(commands / ran, 1) if ran else None,
            'Redis CPU ms per call': round(cpu * 1000 / ran, 2) if ran else None,
            'calls/s one Redis core serves': round(ran / cpu) if cpu > 0 else None}
