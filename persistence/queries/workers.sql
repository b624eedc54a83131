-- name: worker_lock_for_acquire
-- RFC: lock and validate the worker in the acquire transaction. The row lock serialises one
-- worker's concurrent acquires, so capacity cannot be overrun.
SELECT w.id, w.enabled, w.revoked_at IS NOT NULL AS revoked, w.max_concurrent_tasks, w.capabilities, w.task_types
FROM workers w
WHERE w.id = %(worker_id)s
FOR UPDATE

-- name: worker_live_attempts
-- Must be its own statement, run after worker_lock_for_acquire: under READ COMMITTED a
-- subquery of the locking statement would read the snapshot taken before the lock wait and
-- miss the attempt that the previous lock holder just committed (capacity overrun).
-- It also reads the command's time, after the lock (see task_lock).
-- And it pins the plans of fair_share_candidates and task_lock_for_organization, which this
-- transaction runs next (settings local to the transaction, set here to spare a statement). The
-- only plans whose cost does not grow with the backlog walk worker_tasks_org_acquirable_idx in
-- order and stop at the organisation's first eligible (unlocked) task. When the statistics
-- predate the backlog (a queue filled faster than autovacuum analyses it, or autovacuum off)
-- the planner instead reads every acquirable task and sorts them all: measured with 2,000
-- queued tasks, 10.5 ms per acquire against 0.13 ms for the walk. With sorting and bitmap
-- scans disabled for the rest of this short transaction, the walk is the plan whatever the
-- statistics say; no other statement of an acquire sorts.
SELECT count(*) AS live, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now,
       set_config('enable_sort', 'off', true) AS enable_sort,
       set_config('enable_bitmapscan', 'off', true) AS enable_bitmapscan
FROM worker_task_attempts a
WHERE a.worker_id = %(worker_id)s
  AND a.live
  AND a.lease_expires_at > coalesce(%(now)s::timestamptz, clock_timestamp())

-- name: worker_lock
SELECT w.id, w.version, w.head_hash
FROM workers w
WHERE w.id = %(worker_id)s
FOR UPDATE

-- name: attempt_by_acquire_request
-- After worker_lock_for_acquire: the attempts an earlier acquire with this request id created
-- (request_ids: the request id, and the names its leases after the first are stored under).
SELECT a.task_id, a.id, a.acquire_request_id FROM worker_task_attempts a
WHERE a.worker_id = %(worker_id)s AND a.acquire_request_id = ANY(%(request_ids)s::text[])

-- name: worker_by_fingerprint
-- Identity check on every worker request (revocation must bite on an open connection).
SELECT w.id, w.name, w.enabled, w.revoked_at IS NOT NULL AS revoked
FROM workers w
WHERE w.fingerprint = %(fingerprint)s

-- name: worker_cancelling_attempts
-- The worker's live attempts whose task is being cancelled: told on every acquire answer (and
-- whether that cancellation was already handed to the worker once).
SELECT t.id AS task_id, a.id AS attempt_id, t.cancel_delivered_at IS NOT NULL AS delivered
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.worker_id = %(worker_id)s
  AND a.live
  AND t.state = 'cancelling'

-- name: worker_organizations
SELECT ow.organization_id FROM organization_workers ow
WHERE ow.worker_id = %(worker_id)s AND ow.enabled AND ow.revoked_at IS NULL

-- name: worker_read
-- After worker_lock, as its own statement (see task_lock): the worker a registry command decides
-- on, and the command's time.
SELECT w.id, w.version, w.head_hash, w.name, w.fingerprint, w.enabled, w.revoked_at IS NOT NULL AS revoked,
       w.capabilities, w.task_types, w.max_concurrent_tasks,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM workers w
WHERE w.id = %(worker_id)s

-- name: worker_get
-- Operator API: one worker, or nothing when an organisation key asks about a worker that is not
-- (actively) assigned to its organisation (organization_id NULL: administrator, sees all).
SELECT w.id, w.name, w.fingerprint, w.enabled, w.revoked_at, w.capabilities, w.task_types,
       w.max_concurrent_tasks, w.created_at, w.updated_at
FROM workers w
WHERE w.id = %(worker_id)s
  AND (%(organization_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM organization_workers ow
        WHERE ow.worker_id = w.id AND ow.organization_id = %(organization_id)s
          AND ow.enabled AND ow.revoked_at IS NULL))

-- name: workers_page
-- Operator API: workers in id order after a cursor (keyset pagination; the cursor is an id, so
-- an organisation key's cursor never reveals anything about other organisations' rows). With
-- liveness set, only the workers it describes, by the rule of gateway.presence.liveness: seen
-- (the latest published poll, renew or write) within live_seconds: live; within idle_seconds:
-- idle; else, or never: gone.
SELECT w.id, w.name, w.fingerprint, w.enabled, w.revoked_at, w.capabilities, w.task_types,
       w.max_concurrent_tasks, w.created_at, w.updated_at
FROM workers w
WHERE (%(after)s::uuid IS NULL OR w.id > %(after)s::uuid)
  AND (%(liveness)s::text IS NULL OR %(liveness)s::text = (
        SELECT CASE WHEN seen.at >= now.at - make_interval(secs => %(live_seconds)s::float8) THEN 'live'
                    WHEN seen.at >= now.at - make_interval(secs => %(idle_seconds)s::float8) THEN 'idle'
                    ELSE 'gone' END
        FROM (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS at) now
        LEFT JOIN LATERAL (SELECT greatest(p.last_poll_at, p.last_renew_at, p.last_write_at) AS at
                           FROM worker_presence p WHERE p.worker_id = w.id) seen ON true))
  AND (%(organization_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM organization_workers ow
        WHERE ow.worker_id = w.id AND ow.organization_id = %(organization_id)s
          AND ow.enabled AND ow.revoked_at IS NULL))
ORDER BY w.id
LIMIT %(limit)s

-- name: worker_lock_for_write
-- First statement of every worker write: the worker row, share-locked until the write commits.
-- Revocation (of the worker or of one of its assignments) locks the same row FOR UPDATE, so a
-- write and a revocation are ordered: a write that holds this lock commits (and orders its
-- events) before the revocation can, and a write that waited for a revocation reads the
-- standing it left (worker_standing_for_write, its own statement after the locks).
-- (Locking the worker's task rows in the revocation instead would not do: the log's global
-- order is by transaction id, which the revocation takes at its first lock, the worker row's;
-- a write could then lock its task after that, commit first, and still be ordered after it.)
SELECT w.id FROM workers w WHERE w.id = %(worker_id)s FOR SHARE

-- name: worker_standing_for_write
-- After worker_lock_for_write and task_lock: is the worker, or its assignment to the task's
-- organisation, revoked? (No assignment at all counts as revoked.)
SELECT w.revoked_at IS NOT NULL AS worker_revoked, coalesce(ow.revoked_at IS NOT NULL, true) AS assignment_revoked
FROM workers w
JOIN worker_tasks t ON t.id = %(task_id)s
LEFT JOIN organization_workers ow ON ow.worker_id = w.id AND ow.organization_id = t.organization_id
WHERE w.id = %(worker_id)s

-- name: worker_attempts_to_cancel
-- Revocation or disabling, after it committed: the worker's live attempts (of one organisation,
-- or all) whose task is still leased or running (or, with include_cancelling, already being
-- cancelled). Each is then ended in its own transaction, which re-checks under the task lock
-- that this attempt is still the task's live one.
SELECT t.id AS task_id, a.id AS attempt_id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.worker_id = %(worker_id)s
  AND a.live
  AND (t.state IN ('leased', 'running') OR (%(include_cancelling)s::boolean AND t.state = 'cancelling'))
  AND (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
ORDER BY t.id

-- name: workers_last_seen
-- Operator API: when each worker was last seen (its attempts' last_seen_at: the latest event a
-- request of the worker caused): the later of its ended attempts' (one probe each of the
-- (worker_id, ended_seen_at) index) and its live attempts' (read once for all the workers, as
-- many as they run at once). An organisation key (organization_id set) sees only what the
-- worker did on that organisation's tasks.
WITH live AS MATERIALIZED (  -- once, not once per worker
    SELECT a.worker_id, max(a.last_seen_at) AS last_seen_at
    FROM worker_task_attempts a
    WHERE a.worker_id = ANY(%(worker_ids)s::uuid[]) AND a.live
      AND (%(organization_id)s::uuid IS NULL OR EXISTS (
            SELECT 1 FROM worker_tasks t
            WHERE t.id = a.task_id AND t.organization_id = %(organization_id)s::uuid))
    GROUP BY 1
)
SELECT w.id,
       greatest(
           (SELECT max(a.ended_seen_at) FROM worker_task_attempts a
            WHERE a.worker_id = w.id AND a.ended_seen_at IS NOT NULL
              AND (%(organization_id)s::uuid IS NULL OR EXISTS (
                    SELECT 1 FROM worker_tasks t
                    WHERE t.id = a.task_id AND t.organization_id = %(organization_id)s::uuid))),
           (SELECT l.last_seen_at FROM live l WHERE l.worker_id = w.id)) AS last_seen_at
FROM unnest(%(worker_ids)s::uuid[]) AS w(id)

-- name: workers_live_leases
-- Operator API: the live attempts (leased or running) of the workers, oldest lease first; of one
-- organisation's tasks when organization_id is set. Each live attempt's task is read by its key
-- (the subquery behind OFFSET 0 is planned on its own): joined instead, the planner may hash the
-- whole of worker_tasks for a page of workers (bench/console.py, 100,000 tasks: 120 ms, against
-- 30 ms this way for the ~1,900 live attempts of 37 workers).
SELECT a.worker_id, a.task_id, a.id, a.organization_id, a.status, a.leased_at, a.lease_expires_at, a.deadline_at
FROM (SELECT a.worker_id, a.task_id, a.id, a.status, a.leased_at, a.lease_expires_at, a.deadline_at,
             (SELECT t.organization_id FROM worker_tasks t WHERE t.id = a.task_id) AS organization_id
      FROM worker_task_attempts a
      WHERE a.worker_id = ANY(%(worker_ids)s::uuid[])
        AND a.live
      OFFSET 0) a
WHERE (%(organization_id)s::uuid IS NULL OR a.organization_id = %(organization_id)s::uuid)
ORDER BY a.leased_at, a.id
