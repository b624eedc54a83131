-- name: fair_share_candidates
-- Acquisition, after worker_lock_for_acquire and worker_live_attempts (which pins the plans):
-- one row per organisation of the worker that has a task this worker may run now, with that
-- organisation's best such task (priority, age) and its fair-share state. Only organisations
-- flagged (org_queued_work; org_queued_work_busy_idx holds only the flagged) or raised
-- (org_queued_raises, until the sweeper turns them into flags) with queued tasks of one of the
-- worker's task types are read (see migration 0021), so an organisation the worker serves with
-- nothing queued costs nothing. Each of those is probed through
-- worker_tasks_org_acquirable_idx, stopping at its first eligible task, so the cost grows with
-- the worker's organisations that have queued work, never with queued tasks or history. No lock:
-- domain.fairness orders the organisations, task_lock_for_organization then locks a task.
SELECT ow.organization_id, p.priority, p.created_at, coalesce(s.virtual_time, 0) AS virtual_time, o.fair_weight AS weight,
       coalesce(s.live, 0) AS live, o.max_live_attempts
FROM workers w
CROSS JOIN LATERAL (
    SELECT q.organization_id FROM org_queued_work q WHERE q.task_type = ANY(w.task_types) AND q.queued
    UNION
    SELECT r.organization_id FROM org_queued_raises r WHERE r.task_type = ANY(w.task_types)
) q
JOIN organization_workers ow ON ow.organization_id = q.organization_id AND ow.worker_id = w.id
                            AND ow.enabled AND ow.revoked_at IS NULL
JOIN organizations o ON o.id = ow.organization_id
LEFT JOIN org_service s ON s.organization_id = ow.organization_id
CROSS JOIN LATERAL (
    SELECT t.priority, t.created_at
    FROM worker_tasks t
    WHERE t.organization_id = ow.organization_id
      AND t.listed_state IN ('pending', 'retry_wait')
      AND t.available_at <= coalesce(%(now)s::timestamptz, clock_timestamp())
      AND t.attempt_count < t.max_attempts
      AND t.task_type = ANY(w.task_types)
      AND t.required_capabilities <@ w.capabilities
    ORDER BY t.priority DESC, t.created_at ASC
    LIMIT 1
) p
WHERE w.id = %(worker_id)s AND w.enabled AND w.revoked_at IS NULL

-- name: task_lock_for_organization
-- RFC "Atomic task acquisition", in the organisation domain.fairness chose: lock its best
-- eligible task (SKIP LOCKED: concurrent acquirers pass each other), and in the same statement
-- count the lease against the organisation. The org_service row lock serialises the leases and
-- attempt ends of one organisation only (never a table lock); the conditional upsert re-reads
-- the row after the lock, so the cap holds however many acquirers race, and the virtual time
-- advances from the row's latest value (no lost update between workers). Nor does it serve the
-- organisation past the next one in line (ceiling: that one's tag): when concurrent acquirers
-- chose it from the same snapshot and the first of them already moved it ahead, the others go
-- on to the next organisation instead of all serving the same one. No task, the organisation
-- at its cap or past the ceiling: the counters are untouched (the caller tries the next one).
-- more: a lease after the first of one acquire (max_tasks above 1), whose transaction already
-- holds the row lock of an organisation it leased from: it never waits for a second one (two
-- such acquires, or a sweeper releasing several organisations, would deadlock), so it takes
-- the organisation's row only if no one holds it (SKIP LOCKED), and otherwise finds no task.
WITH org AS (
    SELECT s.organization_id FROM org_service s
    WHERE %(more)s::boolean AND s.organization_id = %(organization_id)s
    FOR UPDATE SKIP LOCKED
), task AS (
    SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
           t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
           t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
           t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at,
           t.cancel_delivered_at, t.cancel_delivery_channel, t.scope_ref
    FROM worker_tasks t
    WHERE t.organization_id = %(organization_id)s
      AND t.listed_state IN ('pending', 'retry_wait')
      AND t.available_at <= %(now)s
      AND t.attempt_count < t.max_attempts
      AND t.task_type = ANY(%(task_types)s::text[])
      AND t.required_capabilities <@ %(capabilities)s::text[]
      AND (NOT %(more)s::boolean OR EXISTS (SELECT 1 FROM org))
    ORDER BY t.priority DESC, t.created_at ASC
    FOR UPDATE OF t SKIP LOCKED
    LIMIT 1
), taken AS (
    INSERT INTO org_service AS s (organization_id, virtual_time, served, live, waited_seconds, updated_at)
    SELECT task.organization_id, greatest(0, %(floor)s::float8) + %(quantum)s::float8, 1, 1,
           greatest(extract(epoch FROM %(now)s::timestamptz - task.available_at)::float8, 0), %(now)s::timestamptz
    FROM task
    ON CONFLICT (organization_id) DO UPDATE
    SET virtual_time = greatest(s.virtual_time, %(floor)s::float8) + %(quantum)s::float8,
        served = s.served + 1,
        live = s.live + 1,
        waited_seconds = s.waited_seconds + excluded.waited_seconds,
        updated_at = excluded.updated_at
    WHERE s.live < coalesce((SELECT o.max_live_attempts FROM organizations o WHERE o.id = s.organization_id),
                            2147483647)
      AND greatest(s.virtual_time, %(floor)s::float8) <= %(ceiling)s::float8
    RETURNING s.virtual_time, s.live, s.waited_seconds
)
SELECT task.*, taken.virtual_time, taken.live,
       greatest(extract(epoch FROM %(now)s::timestamptz - task.available_at)::float8, 0) AS waited_seconds,
       -- The organisation's target policy, for the lease answer.
       (SELECT o.target_policy FROM organizations o WHERE o.id = task.organization_id) AS target_policy
FROM task LEFT JOIN taken ON true

-- name: org_service_release
-- Attempts of the organisation that ended (completed, failed, expired, cancelled): no longer
-- live, so no longer counted against its cap. Queued with the command's other writes; the
-- caller sends one per organisation, in organisation order (no deadlock between sweepers).
UPDATE org_service
SET live = greatest(live - %(attempts)s, 0), updated_at = coalesce(%(now)s::timestamptz, clock_timestamp())
WHERE organization_id = %(organization_id)s

-- name: fair_share_get
-- Operator API: an organisation's fair-share settings and state.
SELECT o.id, o.fair_weight, o.max_live_attempts, coalesce(s.virtual_time, 0) AS virtual_time,
       coalesce(s.served, 0) AS served, coalesce(s.live, 0) AS live,
       coalesce(s.waited_seconds, 0) AS waited_seconds, s.updated_at
FROM organizations o
LEFT JOIN org_service s ON s.organization_id = o.id
WHERE o.id = %(organization_id)s

-- name: organization_lock_fair_share
-- The organisation's stream head and fair-share settings, for the command that changes them.
SELECT o.id, o.version, o.head_hash, o.fair_weight, o.max_live_attempts,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM organizations o
WHERE o.id = %(organization_id)s
FOR UPDATE

-- name: org_service_all
-- Audits: every organisation's fair-share state (replay.fairness re-derives it from the log).
SELECT s.organization_id, s.virtual_time, s.served, s.live, s.waited_seconds
FROM org_service s
ORDER BY s.organization_id

-- name: org_queued_work_try_lock
-- The sweeper keeps the queued-work flags (migration 0021) one process at a time: false, another
-- process is at it (never waited for).
SELECT pg_try_advisory_xact_lock(hashtext('org_queued_work')) AS mine

-- name: org_queued_work_lock_flagged
-- After org_queued_work_take_raises, it locks the flagged rows it can lock at once (a row a
-- setter holds is skipped: it has a task queued, or is about to).
SELECT q.organization_id, q.task_type
FROM org_queued_work q
WHERE q.queued
ORDER BY q.organization_id, q.task_type
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: org_queued_work_clear
-- After org_queued_work_lock_flagged, in a later statement (a fresh snapshot, which shows every
-- task a setter that held the row before the lock queued): lower the flags with no task queued.
UPDATE org_queued_work q
SET queued = false
FROM unnest(%(organization_ids)s::uuid[], %(task_types)s::text[]) AS k (organization_id, task_type)
WHERE q.organization_id = k.organization_id AND q.task_type = k.task_type
  AND NOT EXISTS (SELECT FROM worker_tasks t
                  WHERE t.organization_id = q.organization_id AND t.task_type = q.task_type
                    AND t.listed_state IN ('pending', 'retry_wait'))
RETURNING q.organization_id

-- name: org_queued_work_take_raises
-- First the raises committed so far become flags, in one statement (the acquire sees a raise or
-- its flag, never neither). Only rows that are down or absent are written: a flag that is up may
-- be held by a setter, and is left alone. Run only by the process that holds the advisory lock.
WITH taken AS (
    DELETE FROM org_queued_raises RETURNING organization_id, task_type
), raised AS (
    SELECT DISTINCT organization_id, task_type FROM taken
), lowered AS (
    UPDATE org_queued_work q SET queued = true
    FROM raised r
    WHERE q.organization_id = r.organization_id AND q.task_type = r.task_type AND NOT q.queued
    RETURNING q.organization_id
), added AS (
    INSERT INTO org_queued_work (organization_id, task_type, queued)
    SELECT r.organization_id, r.task_type, true FROM raised r
    WHERE NOT EXISTS (SELECT FROM org_queued_work q
                      WHERE q.organization_id = r.organization_id AND q.task_type = r.task_type)
    ON CONFLICT (organization_id, task_type) DO NOTHING
    RETURNING organization_id
)
SELECT (SELECT count(*) FROM raised) AS raised, (SELECT count(*) FROM lowered) + (SELECT count(*) FROM added) AS queued
