-- name: task_lock
-- Time: statements that run after a lock read clock_timestamp(), not now() (the transaction's
-- start), so a stream's event times never go backwards when a command waited for the lock.
-- Lock one task row. The row lock serialises every command on the task, which is what keeps
-- its event stream and hash chain linear. Read what the command needs with a SEPARATE
-- statement after this one (task_read, task_read_for_write): under READ COMMITTED a locking
-- statement that waited re-checks only the locked row, and its joins would still show the
-- snapshot from before the wait (a stale attempt, a batch not yet seen).
SELECT t.id FROM worker_tasks t WHERE t.id = %(task_id)s FOR UPDATE

-- name: task_read_for_write
-- After task_lock: the task, its current attempt, the attempt the request names, and any batch
-- already stored under the request's idempotency key.
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at, t.cancel_delivered_at,
       t.cancel_delivery_channel, t.scope_ref,
       cur.id AS current_id, cur.worker_id AS current_worker_id, cur.attempt_number AS current_attempt_number,
       cur.lease_token_hash AS current_lease_token_hash, cur.status AS current_status, cur.leased_at AS current_leased_at,
       cur.lease_expires_at AS current_lease_expires_at, cur.deadline_at AS current_deadline_at, cur.started_at AS current_started_at,
       cur.finished_at AS current_finished_at, cur.batch_count AS current_batch_count, cur.final_batch_accepted AS current_final_batch_accepted,
       cur.error AS current_error,
       ref.id AS named_id, ref.worker_id AS named_worker_id, ref.attempt_number AS named_attempt_number,
       ref.lease_token_hash AS named_lease_token_hash, ref.status AS named_status, ref.leased_at AS named_leased_at,
       ref.lease_expires_at AS named_lease_expires_at, ref.deadline_at AS named_deadline_at, ref.started_at AS named_started_at,
       ref.finished_at AS named_finished_at, ref.batch_count AS named_batch_count, ref.final_batch_accepted AS named_final_batch_accepted,
       ref.error AS named_error,
       b.id AS batch_id, b.attempt_id AS batch_attempt_id, b.sequence_number AS batch_sequence_number,
       b.idempotency_key AS batch_idempotency_key, b.payload_sha256 AS batch_payload_sha256, b.record_count AS batch_record_count,
       b.final AS batch_final, b.accepted_at AS batch_accepted_at,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
LEFT JOIN worker_task_attempts ref ON ref.id = %(attempt_id)s AND ref.task_id = t.id
LEFT JOIN worker_result_batches b ON b.task_id = t.id AND b.idempotency_key = %(idempotency_key)s
WHERE t.id = %(task_id)s

-- name: task_read
-- After task_lock: the task and its current attempt, for a Gateway-side command.
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at, t.cancel_delivered_at,
       t.cancel_delivery_channel, t.scope_ref,
       cur.id AS current_id, cur.worker_id AS current_worker_id, cur.attempt_number AS current_attempt_number,
       cur.lease_token_hash AS current_lease_token_hash, cur.status AS current_status, cur.leased_at AS current_leased_at,
       cur.lease_expires_at AS current_lease_expires_at, cur.deadline_at AS current_deadline_at, cur.started_at AS current_started_at,
       cur.finished_at AS current_finished_at, cur.batch_count AS current_batch_count, cur.final_batch_accepted AS current_final_batch_accepted,
       cur.error AS current_error,
       coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE t.id = %(task_id)s

-- name: tasks_lock_expired_leases
-- Sweeper: tasks whose live attempt's lease ran out. SKIP LOCKED: a task someone is writing to
-- right now is handled by the next sweep (or was just renewed). Returns the scan too: the
-- caller settles scans in scan-id order, so concurrent sweepers lock scans in one order.
SELECT t.id, t.scan_id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.live
  AND a.lease_expires_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY a.lease_expires_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: tasks_lock_past_deadline
SELECT t.id, t.scan_id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.live
  AND a.deadline_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY a.deadline_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: tasks_lock_cancelling_overdue
-- The cancelling tasks are the few 'cancelling' rows of worker_tasks_listed_created_idx.
SELECT t.id, t.scan_id
FROM worker_tasks t
WHERE t.listed_state = 'cancelling'
  AND t.cancel_requested_at <= coalesce(%(now)s::timestamptz, now()) - %(grace)s::interval
ORDER BY t.cancel_requested_at
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED

-- name: task_get
SELECT t.id, t.version, t.head_hash, t.scan_id, t.scan_job_id, t.organization_id, t.task_type,
       t.required_capabilities, t.priority, t.scope, t.parameters, t.state, t.available_at,
       t.attempt_count, t.max_attempts, t.lease_seconds, t.execution_timeout_seconds,
       t.cancel_requested_at, t.last_error, t.created_at, t.updated_at, t.finished_at, t.cancel_delivered_at,
       t.cancel_delivery_channel, t.scope_ref,
       cur.id AS current_id, cur.worker_id AS current_worker_id, cur.attempt_number AS current_attempt_number,
       cur.lease_token_hash AS current_lease_token_hash, cur.status AS current_status, cur.leased_at AS current_leased_at,
       cur.lease_expires_at AS current_lease_expires_at, cur.deadline_at AS current_deadline_at, cur.started_at AS current_started_at,
       cur.finished_at AS current_finished_at, cur.batch_count AS current_batch_count, cur.final_batch_accepted AS current_final_batch_accepted,
       cur.error AS current_error
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE t.id = %(task_id)s

-- name: task_organization
-- Operator API: whose task is it (organisation keys see only their own)?
SELECT t.organization_id FROM worker_tasks t WHERE t.id = %(task_id)s

-- name: tasks_of_scan
-- A scan's tasks, for audits: those of the jobs its own events queued (what the log says) and
-- any the projection files under the scan, so an edited projection cannot hide one.
SELECT t.id FROM worker_tasks t
WHERE t.scan_job_id = ANY(%(job_ids)s::uuid[]) OR t.scan_id = %(scan_id)s
ORDER BY t.created_at, t.id

-- name: custom_plans
-- For the rest of the (snapshot) transaction: plan every statement for its actual parameters.
-- The list statements below take optional filters (NULL: any); a generic plan, which psycopg's
-- prepared statements would get after a few runs, cannot tell which are set, nor pick an index.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true)

-- name: tasks_page
-- Operator API: tasks newest first, (created_at, id) descending, after a keyset cursor, each with
-- its current attempt's worker. Every filter is optional (NULL: any); worker_id: tasks whose
-- current (latest) attempt is that worker's. Run after custom_plans (see there). At scale the plan
-- walks a worker_tasks index in list order and probes each task's current attempt by its key
-- (bench/finding_work.py: a page reads its 101 rows at 10,000 and at 100,000 tasks).
SELECT t.id, t.organization_id, t.scan_id, t.scan_job_id, t.task_type, t.state, t.priority, t.attempt_count,
       t.max_attempts, t.available_at, t.created_at, t.updated_at, t.finished_at, t.last_error,
       t.current_attempt_id, cur.worker_id
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
  -- A listed state (every state but leased, running and completed) is filtered on listed_state,
  -- the key of worker_tasks_listed_created_idx; completed on state (nearly every row: the page
  -- walks the (created_at, id) indexes); leased and running are listed by tasks_page_live.
  -- Planned for the actual value, the CASE folds to one of the two.
  AND (%(state)s::text IS NULL
       OR CASE WHEN %(state)s::text IN ('leased', 'running', 'completed') THEN t.state = %(state)s::text
               ELSE t.listed_state = %(state)s::text END)
  AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s::text)
  AND (%(scan_id)s::uuid IS NULL OR t.scan_id = %(scan_id)s::uuid)
  AND (%(worker_id)s::uuid IS NULL OR cur.worker_id = %(worker_id)s::uuid)
  AND (%(created_from)s::timestamptz IS NULL OR t.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR t.created_at < %(created_to)s::timestamptz)
  AND (%(before_at)s::timestamptz IS NULL
       OR (t.created_at, t.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY t.created_at DESC, t.id DESC
LIMIT %(limit)s

-- name: tasks_page_live
-- tasks_page for a state a task is in only while its current attempt is live (leased, running),
-- which no worker_tasks index names (migration 0026): the tasks are reached from the live
-- attempts (worker_task_attempts_worker_live_idx or _one_live_idx: as many as the fleet runs at
-- once), each probed by its key (behind OFFSET 0, so never a hash of the whole table), then
-- filtered, sorted and cut to the page. The same columns, filters and order as tasks_page.
SELECT t.id, t.organization_id, t.scan_id, t.scan_job_id, t.task_type, t.state, t.priority, t.attempt_count,
       t.max_attempts, t.available_at, t.created_at, t.updated_at, t.finished_at, t.last_error,
       t.current_attempt_id, cur.worker_id
FROM worker_task_attempts cur
CROSS JOIN LATERAL (SELECT x.id, x.organization_id, x.scan_id, x.scan_job_id, x.task_type, x.state, x.priority,
                           x.attempt_count, x.max_attempts, x.available_at, x.created_at, x.updated_at,
                           x.finished_at, x.last_error, x.current_attempt_id
                    FROM worker_tasks x WHERE x.id = cur.task_id AND x.current_attempt_id = cur.id OFFSET 0) t
WHERE cur.live
  AND t.state = %(state)s::text
  AND (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
  AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s::text)
  AND (%(scan_id)s::uuid IS NULL OR t.scan_id = %(scan_id)s::uuid)
  AND (%(worker_id)s::uuid IS NULL OR cur.worker_id = %(worker_id)s::uuid)
  AND (%(created_from)s::timestamptz IS NULL OR t.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR t.created_at < %(created_to)s::timestamptz)
  AND (%(before_at)s::timestamptz IS NULL
       OR (t.created_at, t.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY t.created_at DESC, t.id DESC
LIMIT %(limit)s

-- name: task_counts
-- Operator API: tasks by organisation and state (organization_id NULL: every organisation).
-- Never a pass over the table's rows: the tasks of each organisation are counted in the
-- (organization_id, created_at, id) index alone; those in a listed state (pending, retry_wait,
-- failed_terminal, cancelling, cancelled) in worker_tasks_listed_created_idx; leased and running
-- tasks through their live attempts (worker_task_attempts_one_live_idx: as many as the fleet
-- runs at once; each task probed by its key behind OFFSET 0, never a hash of the whole table);
-- completed is the difference. Completed tasks are the history, nearly all of
-- the rows (bench/console.py, 100,000 tasks).
WITH every AS (
    SELECT t.organization_id, count(*) AS n
    FROM worker_tasks t
    WHERE (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
    GROUP BY 1
), others AS (
    SELECT t.organization_id, t.listed_state AS state, count(*) AS n
    FROM worker_tasks t
    WHERE t.listed_state IS NOT NULL
      AND (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
    GROUP BY 1, 2
  UNION ALL
    SELECT t.organization_id, t.state::text, count(*) AS n
    FROM worker_task_attempts a
    CROSS JOIN LATERAL (SELECT x.organization_id, x.state FROM worker_tasks x WHERE x.id = a.task_id OFFSET 0) t
    WHERE a.live AND t.state IN ('leased', 'running')
      AND (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
    GROUP BY 1, 2
)
SELECT o.organization_id, o.state, o.n FROM others o
UNION ALL
SELECT c.organization_id, 'completed', c.n
FROM (SELECT e.organization_id,
             (e.n - coalesce((SELECT sum(o.n) FROM others o WHERE o.organization_id = e.organization_id), 0))::bigint AS n
      FROM every e) c
WHERE c.n > 0

-- name: task_queues
-- Operator API: the queue of each organisation (tasks waiting for a lease: pending or
-- retry_wait), how many of them are ready (available now), and since when the oldest ready one
-- has been waiting. Reads only the acquirable partial index's rows.
SELECT t.organization_id, count(*) AS queued,
       count(*) FILTER (WHERE t.available_at <= q.now) AS available,
       min(t.available_at) FILTER (WHERE t.available_at <= q.now) AS oldest_available_at,
       q.now
FROM worker_tasks t
CROSS JOIN (SELECT coalesce(%(now)s::timestamptz, now()) AS now) q
WHERE t.listed_state IN ('pending', 'retry_wait')
  AND (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
GROUP BY t.organization_id, q.now

-- name: snapshot_now
-- The time a read-only snapshot is taken at (now(): its transaction's start), as task_queues uses.
SELECT coalesce(%(now)s::timestamptz, now()) AS now

-- name: queue_depth_sample
-- Unfinished tasks by organisation and state, with the age of the oldest pending one (a sampled
-- gauge, not a hot path; finished tasks are left out, so its cost follows the backlog).
-- Queued and cancelling tasks from worker_tasks_listed_created_idx, leased and running ones
-- through their live attempts.
SELECT t.organization_id, t.listed_state AS state, count(*) AS tasks,
       extract(epoch FROM now() - min(t.created_at) FILTER (WHERE t.listed_state = 'pending')) AS oldest_pending_seconds
FROM worker_tasks t
WHERE t.listed_state IN ('pending', 'retry_wait', 'cancelling')
GROUP BY 1, 2
UNION ALL
SELECT t.organization_id, t.state::text, count(*), NULL::numeric
FROM worker_task_attempts a
CROSS JOIN LATERAL (SELECT x.organization_id, x.state FROM worker_tasks x WHERE x.id = a.task_id OFFSET 0) t
WHERE a.live AND t.state IN ('leased', 'running')
GROUP BY 1, 2

-- name: waiting_organizations_with_work
-- The Gateway's wait-room sweep (gateway.background.waitroom), once per process every
-- wake_sweep_seconds while long-polls wait: of the organisations its waiters serve, those with a
-- task that can be leased now, and that work's task types. Read through
-- worker_tasks_org_acquirable_idx (queued tasks only), never the history.
SELECT t.organization_id, array_agg(DISTINCT t.task_type) AS task_types
FROM worker_tasks t
WHERE t.organization_id = ANY(%(organization_ids)s::uuid[])
  AND t.listed_state IN ('pending', 'retry_wait')
  AND t.available_at <= coalesce(%(now)s::timestamptz, clock_timestamp())
  AND t.attempt_count < t.max_attempts
GROUP BY t.organization_id

-- name: waiting_workers_cancelling
-- The same sweep: the live attempts of waiting workers whose task is being cancelled (a cancel
-- notification that never arrived still reaches the worker's long-poll).
SELECT a.worker_id, a.id
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.worker_id = ANY(%(worker_ids)s::uuid[])
  AND a.live
  AND t.state = 'cancelling'
