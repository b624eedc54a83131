-- name: organization_exists
SELECT o.id, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now FROM organizations o WHERE o.id = %(organization_id)s

-- name: clock_now
SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now

-- name: organization_get
SELECT o.id, o.name, o.created_at, o.updated_at, o.gateway_execution
FROM organizations o WHERE o.id = %(organization_id)s

-- name: organizations_page
-- Operator API: organisations in id order after a cursor; an organisation key sees only its own
-- (visible_to NULL: administrator).
SELECT o.id, o.name, o.created_at, o.updated_at, o.gateway_execution
FROM organizations o
WHERE (%(after)s::uuid IS NULL OR o.id > %(after)s::uuid)
  AND (%(visible_to)s::uuid IS NULL OR o.id = %(visible_to)s::uuid)
ORDER BY o.id
LIMIT %(limit)s

-- name: organization_lock
-- The organisation's own stream head and flag, for its commands (the flag is a column of the
-- locked row itself, so the locking statement sees the latest committed value).
SELECT o.id, o.version, o.head_hash, o.gateway_execution, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM organizations o
WHERE o.id = %(organization_id)s
FOR UPDATE

-- name: organization_mode_for_scan
-- Creating a scan shares the organisation's row lock: a flag change waits for scans being
-- created, and every scan created after it commits sees the new flag.
SELECT o.gateway_execution, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now, o.target_policy,
       o.max_queued_scans
FROM organizations o
WHERE o.id = %(organization_id)s
FOR SHARE

-- name: organization_target_policy
-- The organisation's target policy (NULL: the default one).
SELECT o.target_policy FROM organizations o WHERE o.id = %(organization_id)s

-- name: scan_organization_target_policy
-- The target policy of the scan's organisation (task creation reads it with the scan lock, in
-- the same round trip).
SELECT o.target_policy FROM scans s JOIN organizations o ON o.id = s.organization_id WHERE s.id = %(scan_id)s

-- name: organization_lock_admission
-- The organisation's stream head and admission caps, for the command that changes them.
SELECT o.id, o.version, o.head_hash, o.max_queued_tasks, o.max_queued_scans,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM organizations o
WHERE o.id = %(organization_id)s
FOR UPDATE

-- name: admission_get
-- Operator API: an organisation's admission caps and what they count now.
SELECT o.id, o.max_queued_tasks, o.max_queued_scans,
       (SELECT count(*) FROM worker_tasks t
        WHERE t.organization_id = o.id AND t.listed_state IN ('pending', 'retry_wait')) AS queued_tasks,
       (SELECT count(*) FROM scans s
        WHERE s.organization_id = o.id AND s.listed_status = 'pending'
          AND s.execution_mode = 'gateway') AS queued_scans
FROM organizations o
WHERE o.id = %(organization_id)s

-- name: scan_organization_admission
-- The task cap of the scan's organisation (task creation reads it with the scan lock, in the
-- same round trip; NULL: no cap, and nothing more is read).
SELECT o.id AS organization_id, o.max_queued_tasks
FROM scans s JOIN organizations o ON o.id = s.organization_id
WHERE s.id = %(scan_id)s

-- name: admission_serialize
-- The organisation's creators of one kind (task or scan) take turns, only while it has a cap:
-- a transaction-scoped advisory lock, released at COMMIT or ROLLBACK, so the count read next
-- (a statement of its own, under READ COMMITTED) includes every creation of earlier holders.
SELECT pg_advisory_xact_lock(hashtextextended('admission:' || %(kind)s::text || ':' || %(organization_id)s::text, 0))

-- name: admission_queued_tasks
-- Tasks queued (waiting to be leased): worker_tasks_org_acquirable_idx holds exactly those.
SELECT count(*) AS queued FROM worker_tasks t
WHERE t.organization_id = %(organization_id)s AND t.listed_state IN ('pending', 'retry_wait')

-- name: admission_queued_scans
-- Gateway-executed scans queued: pending, not started yet (scans_org_queued_idx).
SELECT count(*) AS queued FROM scans s
WHERE s.organization_id = %(organization_id)s AND s.listed_status = 'pending'
  AND s.execution_mode = 'gateway'

-- name: console_admission_caps
-- The console's overview: the organisations with an admission cap (of those the key sees; NULL:
-- every one), with the queued work each cap counts (a capped organisation's queue is at most
-- about its cap, read through the same partial indexes as admission itself).
SELECT o.id, o.max_queued_tasks, o.max_queued_scans,
       (SELECT count(*) FROM worker_tasks t
        WHERE t.organization_id = o.id AND t.listed_state IN ('pending', 'retry_wait')) AS queued_tasks,
       (SELECT count(*) FROM scans s
        WHERE s.organization_id = o.id AND s.listed_status = 'pending'
          AND s.execution_mode = 'gateway') AS queued_scans
FROM organizations o
WHERE (o.max_queued_tasks IS NOT NULL OR o.max_queued_scans IS NOT NULL)
  AND (%(organization_id)s::uuid IS NULL OR o.id = %(organization_id)s::uuid)
ORDER BY o.id
LIMIT 200
