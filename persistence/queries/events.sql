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

-- name: stored_events_of_stream
-- Every stored column of one stream's events, in version order (audits: timelines, as-of,
-- bundles). transaction_id as text: psycopg has no loader for xid8.
SELECT e.notification_id, e.originator_id, e.originator_version, e.topic, e.state, e.recorded_at,
       e.transaction_id::text, e.prev_hash, e.hash
FROM events e
WHERE e.originator_id = %(originator_id)s
ORDER BY e.originator_version

-- name: stored_events_of_streams
-- The same for several streams, merged in log (notification_id) order.
SELECT e.notification_id, e.originator_id, e.originator_version, e.topic, e.state, e.recorded_at,
       e.transaction_id::text, e.prev_hash, e.hash
FROM events e
WHERE e.originator_id = ANY(%(originator_ids)s::uuid[])
ORDER BY e.notification_id

-- name: stream_first_topic
-- What kind of stream an id names: the topic of its first event.
SELECT e.topic FROM events e
WHERE e.originator_id = %(originator_id)s
ORDER BY e.originator_version
LIMIT 1

-- name: events_in_log_order
-- The whole log as a rebuild folds it (through a server-side cursor): the order the projector
-- is written for, and the chain hash each projected row records as its head.
SELECT e.originator_id, e.originator_version, e.topic, e.state, e.hash
FROM events e
ORDER BY e.notification_id

-- name: events_in_stream_order
-- The whole log as the hash chains link it (through a server-side cursor), stream by stream.
SELECT e.originator_id, e.originator_version, e.topic, e.state, e.prev_hash, e.hash
FROM events e
ORDER BY e.originator_id, e.originator_version

-- name: events_log_end
-- Where the log ends for the reading transaction: its snapshot's time and last event.
SELECT now(), max(e.notification_id) FROM events e

-- name: snapshot_time
-- The reading transaction's time (now(): its start, the moment its snapshot shows).
SELECT now()

-- name: events_against_sealed_heads
-- Each sealed head (stream, version, hash) the log no longer holds as sealed: whether the event
-- at that version is there at all, and the stream's last version (NULL: no event of it left).
SELECT h.oid, h.v, e.hash IS NOT NULL,
       (SELECT max(x.originator_version) FROM events x WHERE x.originator_id = h.oid)
FROM unnest(%(oids)s::uuid[], %(versions)s::int8[], %(hashes)s::bytea[]) AS h(oid, v, hash)
LEFT JOIN events e ON e.originator_id = h.oid AND e.originator_version = h.v
WHERE e.hash IS DISTINCT FROM h.hash
ORDER BY h.oid

-- name: events_not_sealed
-- Events above their stream's sealed head (or of a stream never sealed): whether the stream was
-- never sealed, and whether the event's transaction was over before the newest seal was taken.
SELECT e.originator_id, e.originator_version, e.recorded_at, h.v IS NULL,
       e.transaction_id < %(xmin)s::xid8
FROM events e
LEFT JOIN unnest(%(oids)s::uuid[], %(versions)s::int8[]) AS h(oid, v) ON h.oid = e.originator_id
WHERE h.v IS NULL OR e.originator_version > h.v
ORDER BY e.originator_id, e.originator_version
