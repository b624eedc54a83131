-- name: organization_exists
SELECT o.id, coalesce(%(now)s::timestamptz, clock_timestamp()) FROM organizations o WHERE o.id = %(organization_id)s

-- name: clock_now
SELECT coalesce(%(now)s::timestamptz, clock_timestamp())

-- name: organization_get
SELECT o.id, o.name, o.created_at, o.updated_at FROM organizations o WHERE o.id = %(organization_id)s

-- name: organizations_page
-- Operator API: organisations in id order after a cursor; an organisation key sees only its own
-- (visible_to NULL: administrator).
SELECT o.id, o.name, o.created_at, o.updated_at
FROM organizations o
WHERE (%(after)s::uuid IS NULL OR o.id > %(after)s::uuid)
  AND (%(visible_to)s::uuid IS NULL OR o.id = %(visible_to)s::uuid)
ORDER BY o.id
LIMIT %(limit)s
