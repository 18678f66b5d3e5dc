"""gunicorn's settings for the API, the one place `make run`, docker-compose, the benchmarks and the fault
tests read (`gunicorn -c python:api.gunicorn_config api.wsgi:application --bind ...`).

The serving model is gthread: API_WORKERS processes of API_THREADS threads each. A request that waits for a
heavy call's result (the default for a client that didn't ask for a handle) holds one thread, blocked on
an Event woken by the process's one notice subscriber (workers.notify), not a whole process: 2 processes of
64 threads hold the host's 64 waiting requests (api_heavy.per_task) however gunicorn spreads them (up to
API_WAITING_PER_PROCESS, 56, in one process) and still have threads for everything else. Why not an async
server: the views, DRF and the ORM are synchronous, and a thread costs a waiting request ~64 KiB of stack
and no CPU (docs/architecture.md).
gthread's `timeout` is the worker's heartbeat to the master, not a limit on a request, so a long wait is
fine; the proxy's read timeout must exceed `wait.max_seconds` (deploy/nginx.conf).
"""
import os

worker_class = 'gthread'
workers = int(os.environ.get('API_WORKERS') or os.environ.get('WEB_CONCURRENCY') or 2)
threads = int(os.environ.get('API_THREADS') or 64)
# Each API process borrows PostgreSQL connections from a pool of this many (api/settings.py); the workers
# don't pool. The environment's DATABASE_POOL_SIZE wins; 0 turns the pool off.
raw_env = [f"DATABASE_POOL_SIZE={os.environ.get('DATABASE_POOL_SIZE') or 16}"]
timeout = 60
graceful_timeout = 30
keepalive = 5
backlog = 2048
accesslog = '-'
errorlog = '-'
loglevel = 'info'
logger_class = 'api.gunicorn_logging.JsonLogger'

# glibc gives a freed block back to the system only when it was mmap'ed, and by default it mmaps blocks
# from 128 KiB up to a threshold that grows to 32 MiB as big blocks are freed: after a few large answers an
# API process kept hundreds of MB it no longer used (bench/answer_memory.py). With the threshold fixed at
# 1 MiB (which also stops it growing), every block that big (a stored answer's text, its slices' buffers)
# goes back when freed. The environment's MALLOC_MMAP_THRESHOLD_ (glibc's own setting) wins.
MMAP_THRESHOLD_BYTES = 1024 * 1024
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def post_fork(server, worker):
    if os.environ.get('MALLOC_MMAP_THRESHOLD_'):
        return
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c'))
        if not libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
            server.log.warning('mallopt(M_MMAP_THRESHOLD) refused; freed answers may stay in the process')
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator decides
        pass
