-- name: checkpoint_heads_of_streams
-- The last sealed head of each of the given streams, and the checkpoint that sealed it.
SELECT DISTINCT ON (h.originator_id) h.originator_id, h.originator_version, h.hash, h.checkpoint_id
FROM checkpoint_heads h
WHERE h.originator_id = ANY(%(originator_ids)s::uuid[])
ORDER BY h.originator_id, h.checkpoint_id DESC
