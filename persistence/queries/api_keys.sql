-- name: api_key_by_hash
-- A live key: not revoked, not expired.
-- The last column: whether last_used_at is due for a refresh (unset, or over a minute old).
SELECT k.id, k.name, k.organization_id,
       k.last_used_at IS NULL OR k.last_used_at < coalesce(%(now)s::timestamptz, now()) - interval '1 minute'
           AS touch_due
FROM api_keys k
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL
  AND (k.expires_at IS NULL OR k.expires_at > coalesce(%(now)s::timestamptz, now()))

-- name: api_key_insert
INSERT INTO api_keys (id, name, organization_id, key_hash, expires_at, bootstrap)
VALUES (%(id)s, %(name)s, %(organization_id)s, %(key_hash)s, %(expires_at)s, %(bootstrap)s)
ON CONFLICT (key_hash) DO NOTHING

-- name: api_key_touch
-- At most one write per key and minute, whatever the request rate.
UPDATE api_keys SET last_used_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s
  AND (last_used_at IS NULL OR last_used_at < coalesce(%(now)s::timestamptz, now()) - interval '1 minute')

-- name: api_keys_page
SELECT id, name, organization_id, created_at, expires_at, revoked_at, last_used_at, bootstrap, replaced_by
FROM api_keys
WHERE (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
  AND (%(organization_id)s::uuid IS NULL OR organization_id = %(organization_id)s::uuid)
ORDER BY id
LIMIT %(limit)s

-- name: api_key_by_id
SELECT id, name, organization_id, created_at, expires_at, revoked_at, last_used_at, bootstrap, replaced_by
FROM api_keys
WHERE id = %(id)s

-- name: api_key_lock
SELECT id, name, organization_id, revoked_at
FROM api_keys
WHERE id = %(id)s
FOR UPDATE

-- name: api_key_revoke
UPDATE api_keys SET revoked_at = coalesce(%(now)s::timestamptz, now()), replaced_by = coalesce(%(replaced_by)s, replaced_by)
WHERE id = %(id)s AND revoked_at IS NULL

-- name: api_key_bootstrap_lookup
SELECT id, revoked_at FROM api_keys WHERE key_hash = %(key_hash)s

-- name: api_keys_revoke_other_bootstrap
-- The administrator key the Gateway starts with replaces any earlier one.
UPDATE api_keys SET revoked_at = coalesce(%(now)s::timestamptz, now())
WHERE bootstrap AND revoked_at IS NULL AND key_hash <> %(key_hash)s
