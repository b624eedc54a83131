-- name: schedule_claim_due
-- Lock due schedules; read them with schedule_read_many afterwards (its own statement, so it
-- sees what the previous lock holder committed). %(skip)s: schedules this process backs off
-- from after a failure (an empty array skips none).
SELECT s.id, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM scheduled_scans s
WHERE s.enabled AND s.next_run_at <= coalesce(%(now)s::timestamptz, clock_timestamp())
  AND s.id <> ALL(%(skip)s::uuid[])
ORDER BY s.next_run_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: schedule_lock
SELECT s.id, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM scheduled_scans s
WHERE s.id = %(schedule_id)s AND s.deleted_at IS NULL
  AND (%(organization_id)s::uuid IS NULL OR s.organization_id = %(organization_id)s::uuid)
FOR UPDATE

-- name: schedule_read_many
SELECT s.id, s.version, s.organization_id, s.name, s.cron, s.interval_seconds, s.timezone, s.targets,
       s.profile, s.enabled, s.misfire_policy, s.next_run_at, s.deleted_at IS NOT NULL AS deleted, s.head_hash
FROM scheduled_scans s
WHERE s.id = ANY(%(ids)s::uuid[])

-- name: schedule_get
SELECT s.id, s.organization_id, s.name, s.cron, s.interval_seconds, s.timezone, s.targets, s.profile,
       s.enabled, s.misfire_policy, s.next_run_at, s.last_run_at, s.created_at, s.updated_at
FROM scheduled_scans s
WHERE s.id = %(schedule_id)s AND s.deleted_at IS NULL
  AND (%(organization_id)s::uuid IS NULL OR s.organization_id = %(organization_id)s::uuid)

-- name: schedule_list
SELECT s.id, s.organization_id, s.name, s.cron, s.interval_seconds, s.timezone, s.targets, s.profile,
       s.enabled, s.misfire_policy, s.next_run_at, s.last_run_at, s.created_at, s.updated_at
FROM scheduled_scans s
WHERE s.deleted_at IS NULL
  AND (%(organization_id)s::uuid IS NULL OR s.organization_id = %(organization_id)s::uuid)
ORDER BY s.created_at, s.id
LIMIT %(limit)s
