-- Idempotency keys of the operator API's creating requests (migration 0024).

-- name: idempotency_forget_expired
-- The key's own row once it has expired (the key may then be used again), and a few other
-- expired rows, oldest first: the table is purged by its users, no background loop needed.
DELETE FROM idempotency_keys
 WHERE (scope, key) IN (
        SELECT scope, key FROM idempotency_keys
         WHERE created_at < coalesce(%(now)s, now()) - %(ttl)s::interval
         ORDER BY created_at
         LIMIT 20)
    OR (scope = %(scope)s AND key = %(key)s AND created_at < coalesce(%(now)s, now()) - %(ttl)s::interval)

-- name: idempotency_claim
-- The key for this request, unless another request holds it: that one's transaction is waited
-- for (the primary key), and then nothing is inserted and no row comes back.
INSERT INTO idempotency_keys (scope, key, operation, request_sha256, created_at)
VALUES (%(scope)s, %(key)s, %(operation)s, %(request_sha256)s, coalesce(%(now)s, now()))
ON CONFLICT (scope, key) DO NOTHING
RETURNING key

-- name: idempotency_first
SELECT operation, request_sha256, resource_id
  FROM idempotency_keys
 WHERE scope = %(scope)s AND key = %(key)s

-- name: idempotency_created
UPDATE idempotency_keys SET resource_id = %(resource_id)s
 WHERE scope = %(scope)s AND key = %(key)s
