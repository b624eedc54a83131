-- name: stored_profile_lock
-- A live profile's row, locked for one of its commands; ``owner`` NULL: any (administrator),
-- else only a profile of that organisation (a global profile is the administrators').
SELECT p.id, p.version, p.head_hash, p.organization_id, p.name, p.profile, p.gateway_execution,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM stored_profiles p
WHERE p.id = %(profile_id)s AND p.deleted_at IS NULL
  AND (%(owner)s::uuid IS NULL OR p.organization_id = %(owner)s::uuid)
FOR UPDATE

-- name: stored_profile_get
-- A live profile as a key sees it: ``visible_to`` NULL (administrator) sees all, an organisation
-- its own and the global ones.
SELECT p.id, p.organization_id, p.name, p.profile, p.gateway_execution, p.created_at, p.updated_at, p.version
FROM stored_profiles p
WHERE p.id = %(profile_id)s AND p.deleted_at IS NULL
  AND (%(visible_to)s::uuid IS NULL OR p.organization_id = %(visible_to)s::uuid OR p.organization_id IS NULL)

-- name: stored_profiles_list
SELECT p.id, p.organization_id, p.name, p.profile, p.gateway_execution, p.created_at, p.updated_at, p.version
FROM stored_profiles p
WHERE p.deleted_at IS NULL
  AND (%(visible_to)s::uuid IS NULL OR p.organization_id = %(visible_to)s::uuid OR p.organization_id IS NULL)
ORDER BY p.organization_id NULLS FIRST, p.name
LIMIT %(limit)s

-- name: stored_profile_for_scan
-- The profile a scan of the organisation means by ``name``: its own, else a global one. Shared
-- lock: an edit or flag change waits for the scans being created from it, and scans created after
-- it commits see the change.
SELECT p.id, p.profile, p.gateway_execution
FROM stored_profiles p
WHERE p.name = %(name)s AND p.deleted_at IS NULL
  AND (p.organization_id = %(organization_id)s OR p.organization_id IS NULL)
ORDER BY p.organization_id NULLS LAST
LIMIT 1
FOR SHARE
