"""The limiter's vocabulary: modes, tiers, lanes, decisions, header names and the defaults table.

Everything here is plain data so that every other module (and the workers) can import it without
pulling in Redis, Django models or Celery.
"""
import enum

OFF, SHADOW, ENFORCE = 'off', 'shadow', 'enforce'
MODES = (OFF, SHADOW, ENFORCE)  # the order shows in validation messages

AWARE, ALL = 'aware', 'all'
ENFORCE_FOR = (AWARE, ALL)
CAPACITY_AWARE_KEY = 'capacity_aware'  # key in the X-OCL-Event-Metadata JSON header

STAFF, CORE, EARLY_ACCESS, PREVIEW = 'staff', 'core', 'early_access', 'preview'
TIERS = (STAFF, CORE, EARLY_ACCESS, PREVIEW)  # highest first


class Lane(str, enum.Enum):
    """A kind of lease lane. Each lane is one Redis sorted set per key (see capacity.keys)."""

    API_HEAVY = 'api_heavy'            # every heavy call, cluster-wide
    API_HEAVY_TASK = 'api_heavy_task'  # calls that hold a worker of this API host while they wait
    ES2_KNN = 'es2_knn'                # semantic $match calls (kNN on the search backend)
    TIER = 'tier'                      # every call of every user in a tier
    USER = 'user'                      # one user's calls

    def __str__(self):
        return self.value


class Decision(str, enum.Enum):
    ADMITTED = 'admitted'
    SHADOW_REFUSED = 'shadow-refused'  # a lane was full; enforce would have refused the call
    REFUSED = 'refused'
    UNAVAILABLE = 'unavailable'        # the limiter couldn't count the call, so it went ahead uncounted
    COALESCED = 'coalesced'            # joined an identical call's work: no lease, no message
    CACHED = 'cached'                  # answered from an identical call's stored result: no lease, no queue

    def __str__(self):
        return self.value


MATCH, RERANK = '$match', '$rerank'
ENDPOINTS = (MATCH, RERANK)

ERROR_CODE = 'capacity_exceeded'
LOG_EVENT = 'ocl_capacity'
CONFIG_LOG_EVENT = 'ocl_capacity_config'
SOURCE_API, SOURCE_COMMAND, SOURCE_FLOWER = 'api', 'command', 'flower'
CONFIG_SOURCES = (SOURCE_API, SOURCE_COMMAND, SOURCE_FLOWER)  # flower: a lane worker's pool resized by hand

HEADER_DECISION = 'X-OCL-Capacity-Decision'
HEADER_LIMIT = 'X-OCL-Capacity-Limit'
HEADER_IN_FLIGHT = 'X-OCL-Capacity-In-Flight'
HEADER_TIER = 'X-OCL-Capacity-Tier'
HEADER_TIER_LIMIT = 'X-OCL-Capacity-Tier-Limit'
HEADER_TIER_IN_FLIGHT = 'X-OCL-Capacity-Tier-In-Flight'
HEADER_SUGGESTED = 'X-OCL-Capacity-Suggested-Concurrency'
HEADERS = (HEADER_DECISION, HEADER_LIMIT, HEADER_IN_FLIGHT, HEADER_TIER, HEADER_TIER_LIMIT,
           HEADER_TIER_IN_FLIGHT, HEADER_SUGGESTED)

# The queues' names, as keys of the config's queue settings (workers.lanes.QUEUES has the queues themselves).
INTERACTIVE_QUEUE, ES2_KNN_QUEUE, API_HEAVY_QUEUE = 'interactive', 'es2_knn', 'api_heavy'
QUEUES = (INTERACTIVE_QUEUE, ES2_KNN_QUEUE, API_HEAVY_QUEUE)

# Decisions are counted per minute too, each minute kept this long (capacity.counters.decisions_per_minute).
DECISION_SERIES_MINUTES = 60

CHOICES = {'mode': MODES, 'enforce_for': ENFORCE_FOR}
MAX_NUMBER = 100000
WAIT_CAP_SECONDS = 3600  # wait.max_seconds can't go above this (a proxy's read timeout must exceed it)
ADVISORY_LOCK_ID = 275275
