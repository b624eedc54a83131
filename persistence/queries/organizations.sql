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
SELECT o.gateway_execution, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now, o.target_policy
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
