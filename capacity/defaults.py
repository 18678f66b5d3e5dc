"""The capacity config's one typed defaults table: a frozen dataclass per section, each field its default.

`Config` is what the rest of the code reads (`capacity.config.get_config()`): attribute access
(`config.api_heavy.cluster`, `config.retry_after.paused`), frozen, and a name that isn't a setting raises
AttributeError at once instead of reading as a missing key. A section keyed by tier or by queue also answers
`section[name]` (KeyError for a name it lacks), for code that holds the name in a variable.

The stored and served form is the nested JSON object (`Config.to_json()`, `Config.from_json()`): what staff
send to /capacity/config/, what a CapacityConfig row keeps, and what `capacity.config.validate` checks
against `DEFAULTS`, the JSON form of `Config()`. One table, two forms: adding a setting is one field here.

Model: DRF's `rest_framework/settings.py` (one defaults table, attribute access, unknown names raise).
"""
import dataclasses
from dataclasses import dataclass, field

from capacity.constants import AWARE, SHADOW


class Section:
    """What every section shares: `section[name]` for a name held in a variable, and its JSON form."""

    def __getitem__(self, name):
        if name not in self.names():
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name, default=None):
        return self[name] if name in self.names() else default

    @classmethod
    def names(cls):
        return tuple(item.name for item in dataclasses.fields(cls))

    def items(self):
        return tuple((name, getattr(self, name)) for name in self.names())

    def to_json(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data):
        """The section of a validated JSON object (nested sections built from their own objects)."""
        values = {}
        for item in dataclasses.fields(cls):
            value = data[item.name]
            kind = item.type
            if isinstance(kind, type) and issubclass(kind, Section):
                value = kind.from_json(value)
            values[item.name] = value
        return cls(**values)


@dataclass(frozen=True)
class ApiHeavy(Section):
    cluster: int = 4    # heavy calls in flight across all API hosts
    per_task: int = 64  # requests waiting for a result on each API host (2 API processes of 64 threads)


@dataclass(frozen=True)
class PerTier(Section):
    """One count per tier (capacity.constants.TIERS, in that order; ceilings, not reservations)."""

    staff: int
    core: int
    early_access: int
    preview: int


@dataclass(frozen=True)
class RetryAfter(Section):
    base: int = 5      # seconds per call ahead in the fullest lane, while its hold time isn't measured yet
    min: int = 1       # the shortest a measured Retry-After is
    max: int = 30
    paused: int = 120  # when a lane's limit is 0
    measured: int = 1  # 1: from the lanes' measured hold times (decisions.retry_after); 0: base only


@dataclass(frozen=True)
class PerQueue(Section):
    """One count per lane queue (capacity.constants.QUEUES, in that order; workers.lanes.QUEUES)."""

    interactive: int = 0
    es2_knn: int = 0
    api_heavy: int = 0


@dataclass(frozen=True)
class Queue(Section):
    deadline_seconds: int = 600  # a queued call expires (with its leases) if no worker starts it by then
    max_waiting: PerQueue = field(default_factory=PerQueue)  # enforce: calls that may wait beyond the limit


@dataclass(frozen=True)
class Cache(Section):
    ttl_seconds: int = 300  # a succeeded call's result answers identical calls this long (0: off)


@dataclass(frozen=True)
class Wait(Section):
    default_seconds: int = 600  # how long a request without Prefer: respond-async waits for its result
    max_seconds: int = 900      # cap on Prefer: wait=N


@dataclass(frozen=True)
class Config(Section):
    """The whole capacity config. All counts are heavy calls in flight at once; all times whole seconds."""

    mode: str = SHADOW
    enforce_for: str = AWARE
    api_heavy: ApiHeavy = field(default_factory=ApiHeavy)
    es2_knn: int = 3             # semantic $match calls
    reserve_single_row: int = 1  # slots only single-row $match calls may use, in every lane they take
    tiers: PerTier = field(default_factory=lambda: PerTier(staff=4, core=4, early_access=3, preview=2))
    per_user: PerTier = field(default_factory=lambda: PerTier(staff=4, core=3, early_access=2, preview=1))
    lease_seconds: int = 60      # a running call's lease expires this long after its last renewal
    renew_seconds: int = 20
    # The longest a call runs: its soft time limit (renewal stops then too); the hard limit, which kills its
    # process, is renew_seconds later (capacity.config.time_limits).
    max_hold_seconds: int = 900
    retry_after: RetryAfter = field(default_factory=RetryAfter)
    queue: Queue = field(default_factory=Queue)
    cache: Cache = field(default_factory=Cache)
    wait: Wait = field(default_factory=Wait)


DEFAULTS = Config().to_json()
