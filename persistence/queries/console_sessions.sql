-- name: console_session_insert
INSERT INTO console_sessions (token_hash, api_key_id, expires_at)
VALUES (%(token_hash)s, %(api_key_id)s, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(seconds)s))

-- name: console_session_operator
-- The live key behind a live session: an expired session, or a revoked or expired key, signs nobody in.
SELECT k.id, k.name, k.organization_id
FROM console_sessions s JOIN api_keys k ON k.id = s.api_key_id
WHERE s.token_hash = %(token_hash)s AND s.expires_at > coalesce(%(now)s::timestamptz, now())
  AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > coalesce(%(now)s::timestamptz, now()))

-- name: console_session_delete
DELETE FROM console_sessions WHERE token_hash = %(token_hash)s

-- name: console_sessions_expired_delete
-- Opening a session clears the expired ones (bounded: the table never grows with dead rows).
DELETE FROM console_sessions
WHERE token_hash IN (SELECT token_hash FROM console_sessions
                     WHERE expires_at <= coalesce(%(now)s::timestamptz, now()) LIMIT 100)
