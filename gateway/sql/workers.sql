-- name: worker_lock_for_acquire
-- RFC: lock and validate the worker, and count its live attempts, in the acquire transaction.
-- The row lock serialises one worker's concurrent acquires, so capacity cannot be overrun.
SELECT w.id, w.enabled, w.revoked_at IS NOT NULL, w.max_concurrent_tasks, w.capabilities, w.task_types,
       (SELECT count(*) FROM worker_task_attempts a
         WHERE a.worker_id = w.id
           AND a.status IN ('leased', 'running')
           AND a.lease_expires_at > coalesce(%(now)s::timestamptz, now())),
       coalesce(%(now)s::timestamptz, now())
FROM workers w
WHERE w.id = %(worker_id)s
FOR UPDATE

-- name: worker_lock
SELECT w.id, w.version, w.head_hash, coalesce(%(now)s::timestamptz, now())
FROM workers w
WHERE w.id = %(worker_id)s
FOR UPDATE
