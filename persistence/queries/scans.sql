-- name: scan_lock
SELECT s.id, s.version, s.head_hash, s.organization_id, s.status, s.execution_mode,
       s.cancel_requested_at IS NOT NULL AS cancel_requested, s.profile IS NOT NULL AS has_profile
FROM scans s
WHERE s.id = %(scan_id)s
FOR UPDATE

-- name: scan_next_job_position
-- Its own statement after scan_lock, so it sees jobs queued by the previous lock holder.
SELECT coalesce(max(j.position) + 1, 0) AS next_position, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM scan_jobs j WHERE j.scan_id = %(scan_id)s

-- name: scan_get
SELECT s.id, s.organization_id, s.status, s.execution_mode, s.targets, s.created_at, s.updated_at,
       s.finished_at, s.profile, s.stored_profile_id, s.legacy_scan_id, s.handed_over_to
FROM scans s
WHERE s.id = %(scan_id)s

-- name: scan_lock_for_orchestration
-- Like scan_lock_for_outcome, with what creating the next profile step needs.
SELECT s.id, s.version, s.head_hash, s.status, s.cancel_requested_at IS NOT NULL AS cancel_requested,
       s.organization_id, s.profile, s.targets
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
SELECT coalesce(array_agg(DISTINCT j.status::text), '{}'::text[]) AS statuses, count(*) AS jobs,
       (SELECT l.status FROM scan_jobs l WHERE l.scan_id = %(scan_id)s ORDER BY l.position DESC LIMIT 1) AS last_status,
       (SELECT l.id FROM scan_jobs l WHERE l.scan_id = %(scan_id)s ORDER BY l.position DESC LIMIT 1) AS last_id
FROM scan_jobs j
WHERE j.scan_id = %(scan_id)s

-- name: scan_found_assets
-- Every asset the scan's tasks reported so far, in the order first seen, those of one batch by
-- kind and value (a later sighting of the same asset by another job repeats it; the caller keeps
-- the first): the next profile step's scope is made of them. The scan's sightings alone (through
-- asset_sightings_scan_order_idx), each asset once: never the result payloads of every batch
-- again, nor the whole assets table, which holds every organisation's. Only a sighting written
-- before kind and value were kept with it (migration 0019) looks its asset up. COLLATE "C": the
-- same order whatever the database's collation. Run after scope_build_settings.
SELECT f.kind, f.value
FROM (SELECT s.first_seen_at, s.kind, s.value
      FROM asset_sightings s
      WHERE s.scan_id = %(scan_id)s AND s.kind IS NOT NULL
      UNION ALL
      SELECT s.first_seen_at, a.kind, a.value
      FROM asset_sightings s
      JOIN assets a ON a.id = s.asset_id
      WHERE s.scan_id = %(scan_id)s AND s.kind IS NULL) f
ORDER BY f.first_seen_at, f.kind COLLATE "C", f.value COLLATE "C"

-- name: scope_build_settings
-- For the rest of the transaction that builds a profile step's scope: no JIT compilation (for a
-- scan of 100,000 assets, the planner's estimate of scan_found_assets passes jit_above_cost, and
-- compiling took longer than the query), and memory to sort its rows in (not on disk).
SELECT set_config('jit', 'off', true) AS jit, set_config('work_mem', '64MB', true) AS work_mem

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

-- name: scans_page
-- Operator API: scans newest first, (created_at, id) descending, after a keyset cursor. Every
-- filter is optional (NULL: any). Run with custom plans (custom_plans), so that the planner sees
-- which filters are set and walks the matching index (migration finding_work) in order.
SELECT s.id, s.organization_id, s.status, s.execution_mode, s.targets, s.created_at, s.updated_at,
       s.finished_at, s.profile, s.stored_profile_id, s.legacy_scan_id, s.handed_over_to
FROM scans s
WHERE (%(organization_id)s::uuid IS NULL OR s.organization_id = %(organization_id)s::uuid)
  -- pending, failed and cancelled are filtered on listed_status, the key of
  -- scans_listed_created_idx; running and success on status (walking the (created_at, id)
  -- indexes). Planned for the actual value, the CASE folds to one of the two.
  AND (%(status)s::text IS NULL
       OR CASE WHEN %(status)s::text IN ('running', 'success') THEN s.status = %(status)s::text
               ELSE s.listed_status = %(status)s::text END)
  AND (%(created_from)s::timestamptz IS NULL OR s.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR s.created_at < %(created_to)s::timestamptz)
  AND (%(before_at)s::timestamptz IS NULL
       OR (s.created_at, s.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY s.created_at DESC, s.id DESC
LIMIT %(limit)s

-- name: scan_jobs_with_tasks
-- Operator API: a scan's jobs in position order, each with its task (a legacy job has none).
SELECT j.id, j.position, j.plugin, j.status, j.execution_mode, j.created_at, j.updated_at, j.started_at,
       j.finished_at,
       t.id AS task_id, t.organization_id AS task_organization_id, t.scan_id AS task_scan_id,
       t.scan_job_id AS task_scan_job_id, t.task_type AS task_task_type, t.state AS task_state,
       t.priority AS task_priority, t.attempt_count AS task_attempt_count, t.max_attempts AS task_max_attempts,
       t.available_at AS task_available_at, t.created_at AS task_created_at, t.updated_at AS task_updated_at,
       t.finished_at AS task_finished_at, t.last_error AS task_last_error,
       t.current_attempt_id AS task_current_attempt_id, cur.worker_id AS task_worker_id
FROM scan_jobs j
LEFT JOIN worker_tasks t ON t.scan_job_id = j.id
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE j.scan_id = %(scan_id)s
ORDER BY j.position
LIMIT %(limit)s

-- name: scan_counts
-- Operator API: scans by organisation and status (organization_id NULL: every organisation).
SELECT s.organization_id, s.status, count(*)
FROM scans s
WHERE (%(organization_id)s::uuid IS NULL OR s.organization_id = %(organization_id)s::uuid)
GROUP BY 1, 2
