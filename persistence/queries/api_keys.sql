-- name: api_key_by_hash
SELECT k.id, k.name, k.organization_id
FROM api_keys k
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL

-- name: api_key_insert
INSERT INTO api_keys (id, name, organization_id, key_hash)
VALUES (%(id)s, %(name)s, %(organization_id)s, %(key_hash)s)
ON CONFLICT (key_hash) DO NOTHING
