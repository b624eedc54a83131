-- name: console_attempts_ended
-- The console's overview: attempts that ended in the window [since, since + 1 hour) — succeeded,
-- failed (as their worker reported) or timed out, at their finished_at; expired, at the moment
-- their lease ran out — by 5-minute bucket (0..11) and status, of one organisation's tasks or
-- of all (organization_id NULL). Index-bound: worker by worker, the (worker_id, ended_seen_at)
-- index (ended_seen_at: last_seen_at of an ended attempt) from an hour before the window (a
-- lease runs out at most lease_seconds, at most an hour, after the worker's last request; a
-- worker's report is its last request), so the rows read are the attempts active in the last
-- two hours, never the history.
SELECT a.status,
       least(floor(extract(epoch FROM a.ended - %(since)s::timestamptz) / 300), 11)::int AS bucket,
       count(*)
FROM workers w
CROSS JOIN LATERAL (
    SELECT x.task_id, x.status,
           CASE WHEN x.status = 'expired' THEN x.lease_expires_at ELSE x.finished_at END AS ended
    FROM worker_task_attempts x
    WHERE x.worker_id = w.id
      AND x.ended_seen_at >= %(since)s::timestamptz - interval '1 hour'
      AND x.status IN ('succeeded', 'failed', 'timeout', 'expired')
    OFFSET 0  -- kept a subquery per worker (never flattened into a join), so it probes the index
) a
WHERE a.ended >= %(since)s::timestamptz
  AND a.ended < %(since)s::timestamptz + interval '1 hour'
  AND (%(organization_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM worker_tasks t WHERE t.id = a.task_id AND t.organization_id = %(organization_id)s::uuid))
GROUP BY 1, 2

-- name: events_position_at
-- The first notification_id recorded at or after %(at)s (past the end: max + 1; NULL: no events),
-- found by bisecting the unique notification_id index — about 40 index probes whatever the size
-- of the log, as recorded_at has no index. recorded_at (clock_timestamp() at insert) grows with
-- notification_id (nextval() at insert) but for the microseconds by which concurrent inserts
-- may cross, which is the precision of the position found.
WITH RECURSIVE bisect(lo, hi) AS (
    SELECT min(e.notification_id), max(e.notification_id) + 1 FROM events e
  UNION ALL
    SELECT CASE WHEN m.at >= %(at)s::timestamptz THEN b.lo ELSE m.mid + 1 END,
           CASE WHEN m.at >= %(at)s::timestamptz THEN m.mid ELSE b.hi END
    FROM bisect b
    CROSS JOIN LATERAL (
        SELECT (b.lo + b.hi) / 2 AS mid,
               (SELECT e.recorded_at FROM events e WHERE e.notification_id >= (b.lo + b.hi) / 2
                ORDER BY e.notification_id LIMIT 1) AS at) m
    WHERE b.lo < b.hi
)
SELECT max(b.lo) AS position FROM bisect b

-- name: console_rejections_since
-- The console's overview: rejected worker writes (WriteRejected) among the newest %(cap)s events
-- from log position %(position)s (events_position_at) and recorded since %(since)s, of one
-- organisation's tasks or of all; and whether the cap was reached (then the count is a floor).
-- Rejections live only in the log: this reads the window's events through the notification_id
-- index, newest first, and never more than the cap.
SELECT count(*) FILTER (WHERE x.topic = 'domain.events:WriteRejected'
                          AND (%(organization_id)s::uuid IS NULL OR EXISTS (
                                SELECT 1 FROM worker_tasks t
                                WHERE t.id = x.originator_id AND t.organization_id = %(organization_id)s::uuid)))
           AS rejections,
       count(*) >= %(cap)s AS capped
FROM (SELECT e.topic, e.originator_id
      FROM events e
      WHERE e.notification_id >= %(position)s AND e.recorded_at >= %(since)s::timestamptz
      ORDER BY e.notification_id DESC
      LIMIT %(cap)s) x

-- name: console_plans
-- For the rest of the console's read-only snapshot: plans for the actual parameters (see
-- custom_plans), and no JIT compilation, whose start-up (measured near a second when a plan's
-- estimated cost crossed jit_above_cost) would dwarf these index-bound reads.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true) AS plan_cache_mode,
       set_config('jit', 'off', true) AS jit

-- name: console_chain_links
-- The console's task page: what each of a stream's first events needs to check its hash-chain
-- link (persistence.chain.check_link), through version %(through)s.
SELECT e.originator_version, e.topic, e.state, e.prev_hash, e.hash
FROM events e
WHERE e.originator_id = %(originator_id)s AND e.originator_version <= %(through)s
ORDER BY e.originator_version

-- name: console_live_lease_counts
-- The console's workers: how many live attempts (leased or running) each worker holds, of one
-- organisation's tasks when organization_id is set (the filter of workers_live_leases).
SELECT a.worker_id, count(*) AS live
FROM worker_task_attempts a
WHERE a.worker_id = ANY(%(worker_ids)s::uuid[])
  AND a.live
  AND (%(organization_id)s::uuid IS NULL OR EXISTS (
        SELECT 1 FROM worker_tasks t WHERE t.id = a.task_id AND t.organization_id = %(organization_id)s::uuid))
GROUP BY a.worker_id

-- name: console_live_leases
-- The console's worker page: the worker's first %(limit)s live attempts, oldest lease first (the
-- rows of workers_live_leases, of one organisation's tasks when organization_id is set).
SELECT a.worker_id, a.task_id, a.id, t.organization_id, a.status, a.leased_at, a.lease_expires_at,
       a.deadline_at
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id
WHERE a.worker_id = %(worker_id)s
  AND a.live
  AND (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
ORDER BY a.leased_at, a.id
LIMIT %(limit)s
