-- name: payload_store
-- Content-addressed: the same payload stored twice is one row.
INSERT INTO result_payloads (sha256, body) VALUES (%(sha256)s, %(body)s)
ON CONFLICT (sha256) DO NOTHING
