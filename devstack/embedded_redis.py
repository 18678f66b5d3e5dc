"""An embedded Redis-compatible server for `make run` on a machine without `redis-server`.

    python -m devstack.embedded_redis --port 6390 [--host 127.0.0.1]

fakeredis's TCP server with Lua (lupa), so the lane scripts, the Celery broker, remote control and Flower
all work against it. Three changes make it usable as a broker for separate processes (STACK-NOTES.md):
TCP_NODELAY on every accepted socket (without it each pipelined exchange stalls ~44 ms on Nagle + delayed
ACK), a listen backlog larger than socketserver's 5 (a dozen processes connect at once at startup), and
daemon handler threads so SIGTERM/SIGINT end the process at once. Data lives in memory only. Good for a
demo on one machine, not for benchmarks or production.
"""
import argparse
import signal
import socket
import sys

import fakeredis

BACKLOG = 512


class EmbeddedRedis(fakeredis.TcpFakeServer):
    request_queue_size = BACKLOG

    def __init__(self, address):
        super().__init__(address)
        self.daemon_threads = True  # TcpFakeServer sets False; daemon threads let the process exit
        self.block_on_close = False

    def get_request(self):
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address


def _exit(signum, frame):
    raise SystemExit(0)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m devstack.embedded_redis',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    server = EmbeddedRedis((args.host, args.port))
    print(f'embedded Redis (fakeredis {fakeredis.__version__}, Lua) listening on {args.host}:{args.port}',
          flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
