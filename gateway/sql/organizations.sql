-- name: organization_exists
SELECT o.id, coalesce(%(now)s::timestamptz, clock_timestamp()) FROM organizations o WHERE o.id = %(organization_id)s

-- name: clock_now
SELECT coalesce(%(now)s::timestamptz, clock_timestamp())
