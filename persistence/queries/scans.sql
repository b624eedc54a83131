-- name: scan_lock
SELECT s.id, s.version, s.head_hash, s.organization_id, s.status, s.execution_mode,
       s.cancel_requested_at IS NOT NULL, s.profile IS NOT NULL
FROM scans s
WHERE s.id = %(scan_id)s
FOR UPDATE

-- name: scan_next_job_position
-- Its own statement after scan_lock, so it sees jobs queued by the previous lock holder.
SELECT coalesce(max(j.position) + 1, 0), coalesce(%(now)s::timestamptz, clock_timestamp())
FROM scan_jobs j WHERE j.scan_id = %(scan_id)s

-- name: scan_get
SELECT s.id, s.organization_id, s.status, s.execution_mode, s.targets, s.created_at, s.updated_at,
       s.finished_at, s.profile, s.stored_profile_id, s.legacy_scan_id, s.handed_over_to
FROM scans s
WHERE s.id = %(scan_id)s

-- name: scan_lock_for_orchestration
-- Like scan_lock_for_outcome, with what creating the next profile step needs.
SELECT s.id, s.version, s.head_hash, s.status, s.cancel_requested_at IS NOT NULL, s.organization_id,
       s.profile, s.targets
FROM scans s
WHERE s.id = %(scan_id)s
FOR UPDATE

-- name: scan_jobs_summary
-- A separate statement after the scan lock, so that (READ COMMITTED) it sees every job change
-- committed by earlier holders of the lock, and this transaction's own. One row whatever the
-- scan's size: the distinct job statuses (all that scan_outcome needs), the number of jobs, and
-- the last job (job i runs profile step i: all that next_step needs). No job's task is read:
-- settling runs on every task that ends, and must not read a large scan's every task each time.
-- (status::text: an array of a domain comes back as text to the driver, which knows the base type only)
SELECT coalesce(array_agg(DISTINCT j.status::text), '{}'::text[]), count(*),
       (SELECT l.status FROM scan_jobs l WHERE l.scan_id = %(scan_id)s ORDER BY l.position DESC LIMIT 1),
       (SELECT l.id FROM scan_jobs l WHERE l.scan_id = %(scan_id)s ORDER BY l.position DESC LIMIT 1)
FROM scan_jobs j
WHERE j.scan_id = %(scan_id)s

-- name: scan_job_scope
-- The scope the task of one job ran with (the next profile step starts from it).
SELECT t.scope FROM worker_tasks t WHERE t.scan_job_id = %(job_id)s

-- name: scan_found_assets
-- Assets in the accepted result batches of the scan's tasks (bounded; deduplicated).
SELECT DISTINCT r ->> 'kind', r ->> 'value'
FROM worker_tasks t
JOIN worker_result_batches b ON b.task_id = t.id
JOIN result_payloads p ON p.sha256 = b.payload_sha256
CROSS JOIN LATERAL jsonb_array_elements(convert_from(p.body, 'UTF8')::jsonb) AS r
WHERE t.scan_id = %(scan_id)s AND jsonb_typeof(r) = 'object' AND r ->> 'type' = 'asset'
  AND r ->> 'kind' IS NOT NULL AND r ->> 'value' IS NOT NULL
LIMIT 10000

-- name: scan_open_tasks
SELECT t.id FROM worker_tasks t
WHERE t.scan_id = %(scan_id)s AND t.state NOT IN ('completed', 'failed_terminal', 'cancelled')
ORDER BY t.created_at, t.id

-- name: scans_lock_by_legacy_id
-- The Gateway scan and/or the legacy record of one legacy scan id of one organisation (at most
-- one of each: legacy ids are unique per organisation).
SELECT s.id, s.execution_mode, s.status, s.legacy_message_sha256, s.version, s.head_hash
FROM scans s
WHERE s.organization_id = %(organization_id)s AND s.legacy_scan_id = %(legacy_scan_id)s
ORDER BY s.id
FOR UPDATE

-- name: scan_job_ids
-- A separate statement after the scan's lock: every job the scan's stream queued.
SELECT j.id FROM scan_jobs j WHERE j.scan_id = %(scan_id)s ORDER BY j.position
