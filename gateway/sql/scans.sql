-- name: scan_lock
SELECT s.id, s.version, s.head_hash, s.organization_id, s.status, s.execution_mode,
       s.cancel_requested_at IS NOT NULL
FROM scans s
WHERE s.id = %(scan_id)s
FOR UPDATE

-- name: scan_next_job_position
-- Its own statement after scan_lock, so it sees jobs queued by the previous lock holder.
SELECT coalesce(max(j.position) + 1, 0), coalesce(%(now)s::timestamptz, clock_timestamp())
FROM scan_jobs j WHERE j.scan_id = %(scan_id)s

-- name: scan_lock_for_outcome
-- Taken after the task lock when a task reaches a terminal state (lock order: task, then scan).
SELECT s.id, s.version, s.head_hash, s.status, s.cancel_requested_at IS NOT NULL
FROM scans s
WHERE s.id = %(scan_id)s
FOR UPDATE

-- name: scan_job_statuses
-- A separate statement after scan_lock_for_outcome, so that (READ COMMITTED) it sees every job
-- change committed by transactions that held the scan lock before us.
SELECT j.id, j.status FROM scan_jobs j WHERE j.scan_id = %(scan_id)s

-- name: scan_get
SELECT s.id, s.organization_id, s.status, s.execution_mode, s.targets, s.created_at, s.updated_at,
       s.finished_at
FROM scans s
WHERE s.id = %(scan_id)s
