"""A Python client for the Heavy Lanes API, with a command line and a load generator (docs/client.md).

    from heavy_lanes_client import Client, Run

    with Client('http://127.0.0.1:8000', token='...') as client:
        report = Run.match(client, ['chest pain', 'short of breath'], '/orgs/HPO/sources/HPO/',
                           semantic=True, batch_size=25, max_concurrency=4).execute()
    for outcome in report.outcomes:
        print(outcome.name, outcome.status, outcome.top or outcome.reason)

Modules:
- the client: client (one HTTP conversation), answers (what an answer means), errors (the error tree),
  models (the values), rows (rows in, outcomes out), phrases (the built-in rows), cli (the command line);
- a bulk run: run (calls in flight, polling, cancel), jobs (batches and each row's outcome), sender (one
  call and its retries), retry (when to send again), concurrency (the adaptive limit), tally (a run's
  counts and its report), progress (the progress line), summary (the table at the end);
- the load generator: load (the whole run), load_plan (what to run, checked), user (one simulated user),
  ledger (every call and its outcome), sampler (/capacity/status/), load_report (groups and tables).

Needs only the standard library and `requests`; installs on its own with pip (pyproject.toml beside this
file), with the `heavy-lanes` command.
"""
__version__ = '0.2.0'

from heavy_lanes_client.answers import error_for
from heavy_lanes_client.client import Client
from heavy_lanes_client.errors import (
    AuthError,
    CapacityRefused,
    ClientError,
    GaveUp,
    IdempotencyConflict,
    InvalidRequest,
    LanePaused,
    ProtocolError,
    RateLimited,
    Refused,
    RequestRejected,
    RunInterrupted,
    ServerError,
    TaskNotFound,
    TransportError,
)
from heavy_lanes_client.jobs import MatchJob, RerankJob
from heavy_lanes_client.models import (
    Capacity,
    Handle,
    RowOutcome,
    RowStatus,
    RunReport,
    Source,
    State,
    Summary,
    Task,
)
from heavy_lanes_client.retry import RetryPolicy
from heavy_lanes_client.run import PollPolicy, Run
from heavy_lanes_client.summary import format_summary

__all__ = [
    'AuthError', 'Capacity', 'CapacityRefused', 'Client', 'ClientError', 'GaveUp', 'Handle',
    'IdempotencyConflict', 'InvalidRequest', 'LanePaused', 'MatchJob', 'PollPolicy', 'ProtocolError',
    'RateLimited', 'Refused', 'RequestRejected', 'RerankJob', 'RetryPolicy', 'RowOutcome', 'RowStatus',
    'Run', 'RunInterrupted', 'RunReport', 'ServerError', 'Source', 'State', 'Summary', 'Task', 'TaskNotFound',
    'TransportError', '__version__', 'error_for', 'format_summary',
]
