-- name: attempts_of_task
-- Operator API: every attempt of a task, oldest first. Never the lease token hash.
SELECT a.id, a.worker_id, a.attempt_number, a.status, a.leased_at, a.lease_expires_at, a.deadline_at,
       a.started_at, a.finished_at, a.batch_count, a.final_batch_accepted, a.error
FROM worker_task_attempts a
WHERE a.task_id = %(task_id)s
ORDER BY a.attempt_number

-- name: attempts_live_count
-- The live leases of the whole fleet (a sampled gauge, not a hot path).
SELECT count(*) FROM worker_task_attempts WHERE live

-- name: rejected_writes_of_attempt
-- After task_lock (the attempt's task): how many refused writes of the attempt were recorded as
-- WriteRejected events so far.
SELECT r.recorded FROM rejected_write_counts r WHERE r.attempt_id = %(attempt_id)s

-- name: rejected_write_count
-- One more refused write of the attempt: recorded (a WriteRejected event) or only counted.
INSERT INTO rejected_write_counts (attempt_id, recorded, unrecorded, last_at)
VALUES (%(attempt_id)s, %(recorded)s, 1 - %(recorded)s, %(now)s)
ON CONFLICT (attempt_id) DO UPDATE
SET recorded = rejected_write_counts.recorded + EXCLUDED.recorded,
    unrecorded = rejected_write_counts.unrecorded + EXCLUDED.unrecorded,
    last_at = EXCLUDED.last_at
