-- SUCCEED: a running work's success, its stored result and its holders read back, in one statement.
--
-- Why by hand: through the ORM this is a transaction of eight round trips (BEGIN, the guarded UPDATE,
-- django-celery-results' get_or_create with its SAVEPOINT, SELECT, INSERT and RELEASE, the read of the
-- holders, COMMIT), and a lane's pool process waits out each of them between one call's work and the
-- next's. A data-modifying common table expression runs atomically as one statement (PostgreSQL only;
-- other databases take that transaction, workers.lifecycle.running.succeed).
--
-- The transition is `succeed` of workers.models.TRANSITIONS (running -> succeeded), guarded by the
-- worker that must still own the work. The result row is written only when the work moved: a work
-- cancelled or taken over meanwhile never gets one. Its columns are the ones django-celery-results'
-- backend writes (workers.lifecycle.running.result_row); a row already there for the task (an earlier
-- delivery's failure) is updated as its manager's store_result updates it, date_created kept.
--
-- Parameters (named):
--   %(id)s            the work's id (the Celery task id)
--   %(sources)s       the states `succeed` starts from (['running'])
--   %(target)s        'succeeded'
--   %(any_worker)s    true: no worker guard; false: only while `worker` is %(worker)s
--   %(worker)s        '<node> pid <pid>' of the pool process that ran it
--   %(finished_at)s   when it ended (also the result row's date_done, and date_created of a new one)
--   %(answer_count)s  the candidates in the answer, or NULL
--   the result row's columns: %(status)s %(result)s %(content_type)s %(content_encoding)s %(meta)s
--   %(traceback)s %(periodic_task_name)s %(task_name)s %(task_args)s %(task_kwargs)s %(result_worker)s
--
-- Returns one row, (holders, shared) of the work as it ended (read under the row's lock: a call that joined
-- while it ran is counted), when it moved; no row when nothing changed.
WITH moved AS (
  UPDATE heavy_work
     SET state = %(target)s, finished_at = %(finished_at)s, error = '', answer_count = %(answer_count)s
   WHERE id = %(id)s AND state = ANY(%(sources)s) AND (%(any_worker)s OR worker = %(worker)s)
  RETURNING id, holders, shared
), stored AS (
  INSERT INTO django_celery_results_taskresult AS kept
         (task_id, status, result, content_type, content_encoding, meta, traceback, periodic_task_name,
          task_name, task_args, task_kwargs, worker, date_created, date_done)
  SELECT moved.id, %(status)s, %(result)s, %(content_type)s, %(content_encoding)s, %(meta)s, %(traceback)s,
         %(periodic_task_name)s, %(task_name)s, %(task_args)s, %(task_kwargs)s, %(result_worker)s,
         %(finished_at)s, %(finished_at)s
    FROM moved
  ON CONFLICT (task_id) DO UPDATE
     SET status = EXCLUDED.status, result = EXCLUDED.result, content_type = EXCLUDED.content_type,
         content_encoding = EXCLUDED.content_encoding, meta = EXCLUDED.meta, traceback = EXCLUDED.traceback,
         periodic_task_name = EXCLUDED.periodic_task_name, task_name = EXCLUDED.task_name,
         task_args = EXCLUDED.task_args, task_kwargs = EXCLUDED.task_kwargs, worker = EXCLUDED.worker,
         date_done = EXCLUDED.date_done
  RETURNING kept.id
)
SELECT moved.holders, moved.shared FROM moved, stored
