-- name: attempts_of_task
-- Operator API: every attempt of a task, oldest first. Never the lease token hash.
SELECT a.id, a.worker_id, a.attempt_number, a.status, a.leased_at, a.lease_expires_at, a.deadline_at,
       a.started_at, a.finished_at, a.batch_count, a.final_batch_accepted, a.error
FROM worker_task_attempts a
WHERE a.task_id = %(task_id)s
ORDER BY a.attempt_number

-- name: attempts_live_count
-- The live leases of the whole fleet (a sampled gauge, not a hot path).
SELECT count(*) FROM worker_task_attempts WHERE status IN ('leased', 'running')
