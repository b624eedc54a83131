-- Bulk operations (migration 0025): a filter's tasks cancelled or retried as a tracked operation.
-- The filter's parameters: organization_id, state, task_type, scan_id, worker_id, created_from,
-- created_to (each NULL: any), and started_at (only tasks created by then: the set is fixed when
-- the operation starts).

-- name: bulk_matching_count
SELECT count(*) AS matched
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
  -- A listed state (every state but leased, running and completed) is filtered on listed_state,
  -- the key of worker_tasks_listed_created_idx; the others on state (those pages walk the
  -- (created_at, id) indexes). Planned for the actual value, the CASE folds to one of the two.
  AND (%(state)s::text IS NULL
       OR CASE WHEN %(state)s::text IN ('leased', 'running', 'completed') THEN t.state = %(state)s::text
               ELSE t.listed_state = %(state)s::text END)
  AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s::text)
  AND (%(scan_id)s::uuid IS NULL OR t.scan_id = %(scan_id)s::uuid)
  AND (%(worker_id)s::uuid IS NULL OR cur.worker_id = %(worker_id)s::uuid)
  AND (%(created_from)s::timestamptz IS NULL OR t.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR t.created_at < %(created_to)s::timestamptz)
  AND t.created_at <= coalesce(%(started_at)s::timestamptz, now())

-- name: bulk_next_tasks
-- The operation's next tasks: selected by its filter, created by its start, not reached yet;
-- oldest first, after the (created_at, id) of the last batch.
SELECT t.id AS task_id, t.created_at
FROM worker_tasks t
LEFT JOIN worker_task_attempts cur ON cur.id = t.current_attempt_id
WHERE (%(organization_id)s::uuid IS NULL OR t.organization_id = %(organization_id)s::uuid)
  -- A listed state (every state but leased, running and completed) is filtered on listed_state,
  -- the key of worker_tasks_listed_created_idx; the others on state (those pages walk the
  -- (created_at, id) indexes). Planned for the actual value, the CASE folds to one of the two.
  AND (%(state)s::text IS NULL
       OR CASE WHEN %(state)s::text IN ('leased', 'running', 'completed') THEN t.state = %(state)s::text
               ELSE t.listed_state = %(state)s::text END)
  AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s::text)
  AND (%(scan_id)s::uuid IS NULL OR t.scan_id = %(scan_id)s::uuid)
  AND (%(worker_id)s::uuid IS NULL OR cur.worker_id = %(worker_id)s::uuid)
  AND (%(created_from)s::timestamptz IS NULL OR t.created_at >= %(created_from)s::timestamptz)
  AND (%(created_to)s::timestamptz IS NULL OR t.created_at < %(created_to)s::timestamptz)
  AND t.created_at <= %(started_at)s::timestamptz
  AND (%(after_at)s::timestamptz IS NULL OR (t.created_at, t.id) > (%(after_at)s::timestamptz, %(after_id)s::uuid))
  AND NOT EXISTS (SELECT 1 FROM bulk_operation_tasks b
                   WHERE b.operation_id = %(operation_id)s AND b.task_id = t.id)
ORDER BY t.created_at, t.id
LIMIT %(limit)s

-- name: bulk_insert
INSERT INTO bulk_operations (id, organization_id, action, filter, reason, attempts, actor, status, total,
                             started_at, updated_at)
VALUES (%(id)s, %(organization_id)s, %(action)s, %(filter)s, %(reason)s, %(attempts)s, %(actor)s, 'running',
        %(total)s, %(started_at)s, %(started_at)s)

-- name: bulk_started_at
SELECT coalesce(%(now)s, now()) AS started_at

-- name: bulk_task_outcome
-- In the transaction of the task's own command: the task reached, once (the primary key).
INSERT INTO bulk_operation_tasks (operation_id, task_id, outcome, detail, at)
VALUES (%(operation_id)s, %(task_id)s, %(outcome)s, %(detail)s, coalesce(%(now)s, now()))

-- name: bulk_claim
-- One running operation no live runner holds, for this runner until runner_until.
UPDATE bulk_operations SET runner_until = coalesce(%(now)s, now()) + %(hold)s::interval
WHERE id = (SELECT id FROM bulk_operations
             WHERE status = 'running' AND (runner_until IS NULL OR runner_until < coalesce(%(now)s, now()))
             ORDER BY started_at
             LIMIT 1
             FOR UPDATE SKIP LOCKED)
RETURNING id, organization_id, action, filter, reason, attempts, actor, started_at

-- name: bulk_count_outcome
-- In the same transaction as the task's outcome row: the operation's count of that outcome, so
-- the counts are exact whatever happens to the runner, and reading them costs one row.
UPDATE bulk_operations
   SET done = done + (%(outcome)s = 'done')::int,
       skipped = skipped + (%(outcome)s = 'skipped')::int,
       failed = failed + (%(outcome)s = 'failed')::int,
       updated_at = coalesce(%(now)s, now())
 WHERE id = %(operation_id)s

-- name: bulk_progress
-- The runner's pass is over: finished when no task is left; the operation released either way.
UPDATE bulk_operations
   SET status = CASE WHEN status = 'running' AND %(finished)s THEN 'finished' ELSE status END,
       finished_at = CASE WHEN status = 'running' AND %(finished)s THEN coalesce(%(now)s, now())
                          ELSE finished_at END,
       runner_until = CASE WHEN %(release)s THEN NULL ELSE runner_until END
 WHERE id = %(operation_id)s

-- name: bulk_status
SELECT status FROM bulk_operations WHERE id = %(operation_id)s

-- name: bulk_stop
UPDATE bulk_operations
   SET status = 'stopped', finished_at = coalesce(%(now)s, now()), updated_at = coalesce(%(now)s, now())
 WHERE id = %(operation_id)s AND status = 'running'

-- name: bulk_get
SELECT id, organization_id, action, filter, reason, attempts, actor, status, total, done, skipped, failed,
       started_at, updated_at, finished_at
FROM bulk_operations
WHERE id = %(operation_id)s

-- name: bulk_list
-- Newest first; an organisation key sees its own (organization_id set), an administrator every one.
SELECT id, organization_id, action, filter, reason, attempts, actor, status, total, done, skipped, failed,
       started_at, updated_at, finished_at
FROM bulk_operations
WHERE (%(organization_id)s::uuid IS NULL OR organization_id = %(organization_id)s::uuid)
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s

-- name: bulk_tasks_page
SELECT task_id, outcome, detail, at
FROM bulk_operation_tasks
WHERE operation_id = %(operation_id)s
  AND (%(after_id)s::uuid IS NULL OR task_id > %(after_id)s::uuid)
ORDER BY task_id
LIMIT %(limit)s
