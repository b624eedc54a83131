-- name: worker_lock_for_acquire
-- RFC: lock and validate the worker in the acquire transaction. The row lock serialises one
-- worker's concurrent acquires, so capacity cannot be overrun.
SELECT w.id, w.enabled, w.revoked_at IS NOT NULL, w.max_concurrent_tasks, w.capabilities, w.task_types
FROM workers w
WHERE w.id = %(worker_id)s
FOR UPDATE

-- name: worker_live_attempts
-- Must be its own statement, run after worker_lock_for_acquire: under READ COMMITTED a
-- subquery of the locking statement would read the snapshot taken before the lock wait and
-- miss the attempt that the previous lock holder just committed (capacity overrun).
-- It also reads the command's time, after the lock (see task_lock).
SELECT count(*), coalesce(%(now)s::timestamptz, clock_timestamp())
FROM worker_task_attempts a
WHERE a.worker_id = %(worker_id)s
  AND a.status IN ('leased', 'running')
  AND a.lease_expires_at > coalesce(%(now)s::timestamptz, clock_timestamp())

-- name: worker_lock
SELECT w.id, w.version, w.head_hash
FROM workers w
WHERE w.id = %(worker_id)s
FOR UPDATE

-- name: attempt_by_acquire_request
-- After worker_lock_for_acquire: the attempt an earlier acquire with this request id created.
SELECT a.task_id, a.id FROM worker_task_attempts a
WHERE a.worker_id = %(worker_id)s AND a.acquire_request_id = %(request_id)s

-- name: worker_by_fingerprint
-- Identity check on every worker request (revocation must bite on an open connection).
SELECT w.id, w.name, w.enabled, w.revoked_at IS NOT NULL
FROM workers w
WHERE w.fingerprint = %(fingerprint)s

-- name: worker_cancelling_attempts
-- The worker's live attempts whose task is being cancelled: told on every acquire answer.
SELECT t.id, a.id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.worker_id = %(worker_id)s
  AND a.status IN ('leased', 'running')
  AND t.state = 'cancelling'

-- name: worker_organizations
SELECT ow.organization_id FROM organization_workers ow
WHERE ow.worker_id = %(worker_id)s AND ow.enabled AND ow.revoked_at IS NULL
