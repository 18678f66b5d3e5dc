-- CLAIM_FIRST: a first delivery's claim of its work, read back with the work's first call, in one statement.
--
-- Why by hand: the ORM needs an UPDATE and a SELECT (and Django has no UPDATE ... RETURNING), and the
-- calls queued behind a one-process pool wait out every round trip of the call before them. A
-- data-modifying common table expression runs atomically as one statement (PostgreSQL only; other
-- databases take workers.lifecycle.running.load + start).
--
-- The transition is `start` of workers.models.TRANSITIONS (queued -> running), guarded further: only a
-- work never delivered before (attempts 0) and not past its queue deadline. Anything else returns no
-- row, and the worker reads and decides as for any delivery.
--
-- Times are the database's clock (now()), as every heartbeat is (workers.lifecycle.running.beat): a worker
-- host whose clock runs ahead or behind neither expires a work early nor looks alive or dead to the others.
--
-- Parameters (named):
--   %(id)s       the work's id (the Celery task id)
--   %(worker)s   '<node> pid <pid>' of the claiming pool process
--   %(queued)s   'queued'   (State.QUEUED)
--   %(running)s  'running'  (State.RUNNING)
--
-- Returns one row when claimed: every column of heavy_work (as updated), then every column of the work's
-- first call (heavy_calls, the call whose id is the work's); no row when nothing changed.
WITH claimed AS (
  UPDATE heavy_work
     SET state = %(running)s, started_at = now(), attempts = attempts + 1,
         worker = %(worker)s, heartbeat_at = now(), rows_done = 0
   WHERE id = %(id)s AND state = %(queued)s AND attempts = 0 AND expires_at > now()
  RETURNING *
)
SELECT claimed.*, first_call.*
  FROM claimed
  JOIN heavy_calls AS first_call ON first_call.id = claimed.id
