-- name: events_of_stream
-- One stream's events in version order, a page at a time, with the time each was recorded.
SELECT e.originator_id, e.originator_version, e.topic, e.state, e.recorded_at
FROM events e
WHERE e.originator_id = %(originator_id)s
  AND e.originator_version > coalesce(%(after_version)s::bigint, 0)
ORDER BY e.originator_version
LIMIT %(limit)s

-- name: ping
-- Readiness: the database answers.
SELECT 1
