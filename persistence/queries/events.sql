-- name: events_of_stream
-- One stream's events in version order, a page at a time, with the time each was recorded.
SELECT e.originator_id, e.originator_version, e.topic, e.state, e.recorded_at
FROM events e
WHERE e.originator_id = %(originator_id)s
  AND e.originator_version > coalesce(%(after_version)s::bigint, 0)
ORDER BY e.originator_version
LIMIT %(limit)s

-- name: event_committed
-- Whether one event, by its stream position and chain hash, is in the log: how a transaction
-- whose connection was lost during its COMMIT learns that the COMMIT happened.
SELECT EXISTS (SELECT 1 FROM events e
               WHERE e.originator_id = %(originator_id)s AND e.originator_version = %(originator_version)s
                 AND e.hash = %(hash)s) AS committed

-- name: ping
-- Readiness: the database answers.
SELECT 1 AS ok

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

-- name: task_creation_traceparents
-- The trace context each task's creation recorded (TaskCreated.traceparent; null when untraced):
-- what a traced Gateway hands the worker with the tasks' leases.
SELECT e.originator_id AS task_id, convert_from(e.state, 'UTF8')::jsonb ->> 'traceparent' AS traceparent
FROM events e
WHERE e.originator_id = ANY(%(task_ids)s::uuid[]) AND e.originator_version = 1

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
SELECT now() AS now, max(e.notification_id) AS position FROM events e

-- name: snapshot_time
-- The reading transaction's time (now(): its start, the moment its snapshot shows).
SELECT now()

-- name: events_against_sealed_heads
-- Each sealed head (stream, version, hash) the log no longer holds as sealed: whether the event
-- at that version is there at all, and the stream's last version (NULL: no event of it left).
SELECT h.oid, h.v, e.hash IS NOT NULL AS present,
       (SELECT max(x.originator_version) FROM events x WHERE x.originator_id = h.oid) AS last_version
FROM unnest(%(oids)s::uuid[], %(versions)s::int8[], %(hashes)s::bytea[]) AS h(oid, v, hash)
LEFT JOIN events e ON e.originator_id = h.oid AND e.originator_version = h.v
WHERE e.hash IS DISTINCT FROM h.hash
ORDER BY h.oid

-- name: events_not_sealed
-- Events above their stream's sealed head (or of a stream never sealed): whether the stream was
-- never sealed, and whether the event's transaction was over before the newest seal was taken.
SELECT e.originator_id, e.originator_version, e.recorded_at, h.v IS NULL AS unsealed_stream,
       e.transaction_id < %(xmin)s::xid8 AS committed_before
FROM events e
LEFT JOIN unnest(%(oids)s::uuid[], %(versions)s::int8[]) AS h(oid, v) ON h.oid = e.originator_id
WHERE h.v IS NULL OR e.originator_version > h.v
ORDER BY e.originator_id, e.originator_version

-- name: events_by_group
-- The log stream group by stream group, for the bounded and parallel fold of replay (through a
-- server-side cursor). A task's stream belongs to its scan's group, every other stream is a
-- group of its own (stream_group(), migration 0016, reads it from the stream's first event,
-- never from a projection). Those are the only streams that write one row together (a task
-- updates its scan job and starts its scan), so folding group by group, each in log order, makes
-- the rows folding the whole log makes. Groups in [lo, hi) (hi NULL: no upper bound) in uuid
-- order, then notification_id. Streams are found by their first event: one whose first event
-- is missing is not read (a chain break; the caller counts events to notice).
SELECT e.originator_id, e.originator_version, e.topic, e.state, e.hash, s.grp
FROM (SELECT g.id, g.grp FROM (
        SELECT f.originator_id AS id, stream_group(f.topic, f.state, f.originator_id) AS grp
        FROM events f WHERE f.originator_version = 1) g
      WHERE g.grp >= %(lo)s::uuid AND (%(hi)s::uuid IS NULL OR g.grp < %(hi)s::uuid)
      ORDER BY g.grp) s
CROSS JOIN LATERAL (SELECT x.* FROM events x WHERE x.originator_id = s.id OFFSET 0) e
ORDER BY s.grp, e.notification_id

-- name: events_of_groups
-- The same for a list of groups (an incremental verification): the candidate streams are the
-- groups themselves, the given streams, and the tasks the projection files under the groups;
-- each candidate's group is still read from its own first event.
SELECT e.originator_id, e.originator_version, e.topic, e.state, e.hash, s.grp
FROM (SELECT f.originator_id AS id, stream_group(f.topic, f.state, f.originator_id) AS grp
      FROM events f
      WHERE f.originator_version = 1
        AND f.originator_id IN (SELECT unnest(%(groups)s::uuid[]) UNION SELECT unnest(%(streams)s::uuid[])
                                UNION SELECT t.id FROM worker_tasks t WHERE t.scan_id = ANY(%(groups)s::uuid[]))
        AND stream_group(f.topic, f.state, f.originator_id) = ANY(%(groups)s::uuid[])
      ORDER BY 2) s
CROSS JOIN LATERAL (SELECT x.* FROM events x WHERE x.originator_id = s.id OFFSET 0) e
ORDER BY s.grp, e.notification_id

-- name: streams_touched_since
-- The streams with an event the given checkpoint did not seal, with their group, in group
-- order: what an incremental verification from that checkpoint refolds. Candidates are the
-- events of transactions from the checkpoint's transaction_xmin on (the events_transaction_idx
-- index; every older transaction was visible to it); of those, an event at or below the
-- stream's head sealed by then is not new.
SELECT c.id, stream_group(f.topic, f.state, f.originator_id) AS grp
FROM (SELECT DISTINCT t.originator_id AS id FROM events t
      WHERE t.transaction_id >= %(xmin)s::xid8
        AND NOT EXISTS (SELECT 1 FROM checkpoint_heads h
                        WHERE h.originator_id = t.originator_id AND h.checkpoint_id <= %(checkpoint)s::bigint
                          AND h.originator_version >= t.originator_version)) c
JOIN events f ON f.originator_id = c.id AND f.originator_version = 1
ORDER BY 2, 1

-- name: events_count
-- How many events the reading transaction sees.
SELECT count(*) FROM events

-- name: event_partitions_reach_sample
-- How far past now the event log's time partitions reach, in seconds (negative: events already
-- land in the default partition; NULL: no time partition at all). A sampled gauge, not a hot path.
SELECT extract(epoch FROM max(upper_bound) - now()) AS seconds_ahead
FROM event_partitions
WHERE NOT is_default
