-- name: payload_store
-- Content-addressed: the same payload stored twice is one row.
INSERT INTO result_payloads (sha256, body) VALUES (%(sha256)s, %(body)s)
ON CONFLICT (sha256) DO NOTHING

-- name: payloads_by_sha256
-- Stored payloads by content hash (audit bundles carry the payloads of their result batches).
SELECT p.sha256, p.body FROM result_payloads p WHERE p.sha256 = ANY(%(sha256s)s::text[])
