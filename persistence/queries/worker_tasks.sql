-- name: task_lock
-- Time: statements that run after a lock read clock_timestamp(), not now() (the transaction's
-- start), so a stream's event times never go backwards when a command waited for the lock.
-- Lock one task row. The row lock serialises every command on the task, which is what keeps
-- its event stream and hash chain linear. Read what the command needs with a SEPARATE
-- statement after this one (task_read, task_read_for_write): under READ COMMITTED a locking
-- statement that waited re-checks only the locked row, and its joins would still show the
-- snapshot from before the wait (a stale attempt, a batch not yet seen).
SELECT t.id FROM worker_tasks t WHERE t.id = %(task_id)s FOR UPDATE

-- name: task_read_for_write
-- After task_lock: the task, its current attempt, the attempt the request names, and any batch
-- already stored under the request's idempotency key.
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at,
       cur.id, cur.worker_id, cur.attempt_number, cur.lease_token_hash, cur.status, cur.leased_at,
       cur.lease_expires_at, cur.deadline_at, cur.started_at, cur.finished_at, cur.batch_count,
       cur.final_batch_accepted, cur.error,
       ref.id, ref.worker_id, ref.attempt_number, ref.lease_token_hash, ref.status, ref.leased_at,
       ref.lease_expires_at, ref.deadline_at, ref.started_at, ref.finished_at, ref.batch_count,
       ref.final_batch_accepted, ref.error,
       b.id, b.attempt_id, b.sequence_number, b.idempotency_key, b.payload_sha256, b.record_count,
       b.final, b.accepted_at,
       coalesce(%(now)s::timestamptz, clock_timestamp())
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
LEFT JOIN worker_task_attempts ref ON ref.id = %(attempt_id)s AND ref.task_id = t.id
LEFT JOIN worker_result_batches b ON b.task_id = t.id AND b.idempotency_key = %(idempotency_key)s
WHERE t.id = %(task_id)s

-- name: task_read
-- After task_lock: the task and its current attempt, for a Gateway-side command.
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at,
       cur.id, cur.worker_id, cur.attempt_number, cur.lease_token_hash, cur.status, cur.leased_at,
       cur.lease_expires_at, cur.deadline_at, cur.started_at, cur.finished_at, cur.batch_count,
       cur.final_batch_accepted, cur.error,
       coalesce(%(now)s::timestamptz, clock_timestamp())
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE t.id = %(task_id)s

-- name: task_lock_acquirable
-- RFC "Atomic task acquisition": one eligible task for this worker. Organisation assignment,
-- task type and capabilities are checked in the same query; SKIP LOCKED lets concurrent
-- acquirers pass each other instead of queueing on the same row. The partial index on
-- acquirable states keeps this independent of how much finished history the table holds, and
-- worker_live_attempts, earlier in the same transaction, pins the plan that walks it (see there).
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at
FROM worker_tasks t
JOIN organization_workers ow
  ON ow.organization_id = t.organization_id
 AND ow.worker_id = %(worker_id)s
 AND ow.enabled
 AND ow.revoked_at IS NULL
WHERE t.state IN ('pending', 'retry_wait')
  AND t.available_at <= %(now)s
  AND t.attempt_count < t.max_attempts
  AND t.task_type = ANY(%(task_types)s::text[])
  AND t.required_capabilities <@ %(capabilities)s::text[]
ORDER BY t.priority DESC, t.created_at ASC
FOR UPDATE OF t SKIP LOCKED
LIMIT 1

-- name: tasks_lock_expired_leases
-- Sweeper: tasks whose live attempt's lease ran out. SKIP LOCKED: a task someone is writing to
-- right now is handled by the next sweep (or was just renewed). Returns the scan too: the
-- caller settles scans in scan-id order, so concurrent sweepers lock scans in one order.
SELECT t.id, t.scan_id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.status IN ('leased', 'running')
  AND a.lease_expires_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY a.lease_expires_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: tasks_lock_past_deadline
SELECT t.id, t.scan_id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.status IN ('leased', 'running')
  AND a.deadline_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY a.deadline_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: tasks_lock_cancelling_overdue
SELECT t.id, t.scan_id
FROM worker_tasks t
WHERE t.state = 'cancelling'
  AND t.cancel_requested_at <= coalesce(%(now)s::timestamptz, now()) - %(grace)s::interval
ORDER BY t.cancel_requested_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: task_get
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at,
       cur.id, cur.worker_id, cur.attempt_number, cur.lease_token_hash, cur.status, cur.leased_at,
       cur.lease_expires_at, cur.deadline_at, cur.started_at, cur.finished_at, cur.batch_count,
       cur.final_batch_accepted, cur.error
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE t.id = %(task_id)s

-- name: task_organization
-- Operator API: whose task is it (organisation keys see only their own)?
SELECT t.organization_id FROM worker_tasks t WHERE t.id = %(task_id)s

-- name: tasks_of_scan
-- A scan's tasks, for audits: those of the jobs its own events queued (what the log says) and
-- any the projection files under the scan, so an edited projection cannot hide one.
SELECT t.id FROM worker_tasks t
WHERE t.scan_job_id = ANY(%(job_ids)s::uuid[]) OR t.scan_id = %(scan_id)s
ORDER BY t.created_at, t.id

-- name: queue_depth_sample
-- Unfinished tasks by organisation and state, with the age of the oldest pending one (a sampled
-- gauge, not a hot path; finished tasks are left out, so its cost follows the backlog).
SELECT organization_id, state, count(*) AS tasks,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending')) AS oldest_pending_seconds
FROM worker_tasks
WHERE state IN ('pending', 'leased', 'running', 'retry_wait', 'cancelling')
GROUP BY organization_id, state
