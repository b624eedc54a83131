-- leasehold's lifecycle in pure SQL, for pgbench: the same statements and rows the service layer
-- sends (create_task -> acquire -> complete carrying the final batch), with no client work at all:
-- no decision, no serialisation, no hashing (hashes are sha256 of a counter), states of the size
-- the real events have, fair-share counters and fencing reads included (the statement list
-- bench/ledger.py --statements prints). What PostgreSQL alone needs for our rows: the second yardstick of
-- bench/core_lifecycle.py. Each client works with its own organisation and worker, each
-- lifecycle on a scan of its own (set up by replica_setup.sql):
-- pgbench -n -M prepared -f replica_lifecycle.sql -c C.
-- (No colon in a literal: pgbench would read "':name" in one as a variable, hence chr(58).)
SELECT nextval('replica_lifecycle') AS n, md5('org' || :client_id)::uuid AS org,
       md5('worker' || :client_id)::uuid AS worker \gset
-- create_task: lock the scan, its next job position, then one combined write
BEGIN;
SELECT id, version, head_hash FROM scans WHERE id = md5(:n::text)::uuid FOR UPDATE;
SELECT coalesce(max(position) + 1, 0), clock_timestamp() FROM scan_jobs WHERE scan_id = md5(:n::text)::uuid;
WITH e AS (INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash) VALUES
        (md5(:n::text)::uuid, 2, 'domain.events' || chr(58) || 'ScanJobQueued', convert_to(repeat('x', 227), 'UTF8'),
         sha256((:n::text || 'a')::bytea), sha256((:n::text || 'b')::bytea)),
        (md5('task' || :n::text)::uuid, 1, 'domain.events' || chr(58) || 'TaskCreated', convert_to(repeat('x', 430), 'UTF8'),
         sha256((:n::text || 'c')::bytea), sha256((:n::text || 'd')::bytea))),
     s AS (UPDATE scans SET version = 2, head_hash = sha256((:n::text || 'b')::bytea), updated_at = now()
           WHERE id = md5(:n::text)::uuid),
     j AS (INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode,
                                  created_at, updated_at)
           VALUES (md5('job' || :n::text)::uuid, md5(:n::text)::uuid, :org::uuid, 0, 'probe', 'queued', 'gateway', now(), now())),
     t AS (INSERT INTO worker_tasks (id, scan_job_id, scan_id, organization_id, task_type, required_capabilities,
                                     priority, scope, parameters, state, available_at, attempt_count, max_attempts,
                                     lease_seconds, execution_timeout_seconds, created_at, updated_at, version,
                                     head_hash)
           VALUES (md5('task' || :n::text)::uuid, md5('job' || :n::text)::uuid, md5(:n::text)::uuid, :org::uuid, 'probe', '{}', 0,
                   '{"host": "bench.example.test"}', '{}', 'pending', now(), 0, 3, 60, 600, now(), now(), 1,
                   sha256((:n::text || 'd')::bytea)))
SELECT pg_notify('leasehold', 'available:' || :org::uuid::text);
COMMIT;
-- acquire: the worker's organisations (before the transaction), lock the worker, count its live
-- attempts, the fair-share candidates (the organisations with queued work, each with its best
-- task and its fair-share state), take the chosen organisation's head of queue and count the
-- lease in its fair-share row (one statement), one combined write
SELECT ow.organization_id FROM organization_workers ow
WHERE ow.worker_id = :worker::uuid AND ow.enabled AND ow.revoked_at IS NULL;
BEGIN;
SELECT id, enabled, revoked_at, max_concurrent_tasks, capabilities, task_types FROM workers
WHERE id = :worker::uuid FOR UPDATE;
SELECT count(*), clock_timestamp() FROM worker_task_attempts
WHERE worker_id = :worker::uuid AND live AND lease_expires_at > clock_timestamp();
SELECT ow.organization_id, p.priority, p.created_at, coalesce(s.virtual_time, 0), o.fair_weight,
       coalesce(s.live, 0), o.max_live_attempts
FROM workers w
CROSS JOIN LATERAL (
    SELECT q.organization_id FROM org_queued_work q WHERE q.task_type = ANY(w.task_types) AND q.queued
    UNION
    SELECT r.organization_id FROM org_queued_raises r WHERE r.task_type = ANY(w.task_types)) q
JOIN organization_workers ow ON ow.organization_id = q.organization_id AND ow.worker_id = w.id
                            AND ow.enabled AND ow.revoked_at IS NULL
JOIN organizations o ON o.id = ow.organization_id
LEFT JOIN org_service s ON s.organization_id = ow.organization_id
CROSS JOIN LATERAL (
    SELECT t.priority, t.created_at FROM worker_tasks t
    WHERE t.organization_id = ow.organization_id AND t.listed_state IN ('pending', 'retry_wait')
      AND t.available_at <= clock_timestamp() AND t.attempt_count < t.max_attempts
      AND t.task_type = ANY(w.task_types) AND t.required_capabilities <@ w.capabilities
    ORDER BY t.priority DESC, t.created_at ASC LIMIT 1) p
WHERE w.id = :worker::uuid AND w.enabled AND w.revoked_at IS NULL;
WITH task AS (
    SELECT t.id, t.scan_job_id, t.scan_id, t.organization_id, t.available_at FROM worker_tasks t
    WHERE t.organization_id = :org::uuid AND t.listed_state IN ('pending', 'retry_wait')
      AND t.available_at <= now() AND t.attempt_count < t.max_attempts
      AND t.task_type = ANY('{probe}'::text[]) AND t.required_capabilities <@ '{}'::text[]
    ORDER BY t.priority DESC, t.created_at ASC FOR UPDATE OF t SKIP LOCKED LIMIT 1),
taken AS (
    INSERT INTO org_service AS s (organization_id, virtual_time, served, live, waited_seconds, updated_at)
    SELECT task.organization_id, 1, 1, 1, 0, now() FROM task
    ON CONFLICT (organization_id) DO UPDATE
    SET virtual_time = s.virtual_time + 1, served = s.served + 1, live = s.live + 1,
        waited_seconds = s.waited_seconds + excluded.waited_seconds, updated_at = excluded.updated_at
    RETURNING s.virtual_time)
SELECT task.id AS task, task.scan_job_id AS job, task.scan_id AS scan FROM task LEFT JOIN taken ON true \gset
WITH e AS (INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash) VALUES
        (:task::uuid, 2, 'domain.events' || chr(58) || 'TaskLeased', convert_to(repeat('x', 533), 'UTF8'),
         sha256((:n::text || 'd')::bytea), sha256((:n::text || 'e')::bytea))),
     t AS (UPDATE worker_tasks SET state = 'leased', attempt_count = 1, current_attempt_id = md5('attempt' || :n::text)::uuid,
                                   version = 2, head_hash = sha256((:n::text || 'e')::bytea), updated_at = now()
           WHERE id = :task::uuid),
     a AS (INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status,
                                             leased_at, lease_expires_at, deadline_at, batch_count,
                                             final_batch_accepted, last_seen_at)
           VALUES (md5('attempt' || :n::text)::uuid, :task::uuid, :worker::uuid, 1, sha256((:n::text || 'token')::bytea), 'leased',
                   now(), now() + interval '60 seconds', now() + interval '600 seconds', 0, false, now())),
     j AS (UPDATE scan_jobs SET status = 'running', started_at = now(), updated_at = now() WHERE id = :job::uuid),
     s AS (UPDATE scans SET status = 'running', updated_at = now() WHERE id = :scan::uuid AND status = 'pending')
SELECT 1;
COMMIT;
-- complete carrying the final batch: the worker's standing (fencing: the worker and its
-- assignment not revoked, the worker row share-locked against a concurrent revocation), lock
-- and read the task, the combined write, the lease's end in the fair-share row, the batch's
-- asset, then settle the scan (lock, jobs summary, the scan's combined write)
BEGIN;
SELECT w.id FROM workers w WHERE w.id = :worker::uuid FOR SHARE;
SELECT id FROM worker_tasks WHERE id = :task::uuid FOR UPDATE;
SELECT w.revoked_at IS NOT NULL, coalesce(ow.revoked_at IS NOT NULL, false) FROM workers w
JOIN worker_tasks t ON t.id = :task::uuid
LEFT JOIN organization_workers ow ON ow.worker_id = w.id AND ow.organization_id = t.organization_id
WHERE w.id = :worker::uuid;
SELECT t.state, a.status, a.batch_count, clock_timestamp() FROM worker_tasks t
JOIN worker_task_attempts a ON a.id = t.current_attempt_id WHERE t.id = :task::uuid;
WITH e AS (INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash) VALUES
        (:task::uuid, 3, 'domain.events' || chr(58) || 'TaskStarted', convert_to(repeat('x', 154), 'UTF8'),
         sha256((:n::text || 'e')::bytea), sha256((:n::text || 'f')::bytea)),
        (:task::uuid, 4, 'domain.events' || chr(58) || 'ResultBatchAccepted', convert_to(repeat('x', 360), 'UTF8'),
         sha256((:n::text || 'f')::bytea), sha256((:n::text || 'g')::bytea)),
        (:task::uuid, 5, 'domain.events' || chr(58) || 'TaskCompleted', convert_to(repeat('x', 207), 'UTF8'),
         sha256((:n::text || 'g')::bytea), sha256((:n::text || 'h')::bytea))),
     t AS (UPDATE worker_tasks SET state = 'completed', finished_at = now(), version = 5,
                                   head_hash = sha256((:n::text || 'h')::bytea), updated_at = now() WHERE id = :task::uuid),
     a AS (UPDATE worker_task_attempts SET status = 'succeeded', started_at = now(), finished_at = now(),
                                           batch_count = 1, final_batch_accepted = true, last_seen_at = now()
           WHERE id = md5('attempt' || :n::text)::uuid),
     p AS (INSERT INTO result_payloads (sha256, body)
           VALUES (encode(sha256((:n::text || 'payload')::bytea), 'hex'), convert_to(repeat('x', 90), 'UTF8'))
           ON CONFLICT (sha256) DO NOTHING),
     b AS (INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key,
                                              payload_sha256, record_count, final, status, accepted_at)
           VALUES (md5('batch' || :n::text)::uuid, :task::uuid, md5('attempt' || :n::text)::uuid, 1, 'final',
                   encode(sha256((:n::text || 'payload')::bytea), 'hex'), 1, true, 'accepted', now())),
     j AS (UPDATE scan_jobs SET status = 'success', finished_at = now(), updated_at = now() WHERE id = :job::uuid)
SELECT 1;
UPDATE org_service SET live = greatest(live - 1, 0), updated_at = clock_timestamp() WHERE organization_id = :org::uuid;
WITH a AS (
    INSERT INTO assets (id, organization_id, kind, value, attributes, first_seen_at, last_seen_at, first_batch_id)
    VALUES (md5('asset' || :n::text)::uuid, :org::uuid, 'host', :n::text || '.bench.example.test', '{}', now(), now(),
            md5('batch' || :n::text)::uuid)
    ON CONFLICT (organization_id, kind, value) DO UPDATE SET last_seen_at = excluded.last_seen_at
    RETURNING id)
INSERT INTO asset_sightings (asset_id, scan_job_id, scan_id, first_seen_at)
SELECT a.id, :job::uuid, :scan::uuid, now() FROM a ON CONFLICT DO NOTHING;
SELECT id, version, head_hash, status FROM scans WHERE id = :scan::uuid FOR UPDATE;
SELECT array_agg(DISTINCT status::text), count(*) FROM scan_jobs WHERE scan_id = :scan::uuid;
WITH e AS (INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash) VALUES
        (:scan::uuid, 3, 'domain.events' || chr(58) || 'ScanFinished', convert_to(repeat('x', 84), 'UTF8'),
         sha256((:n::text || 'b')::bytea), sha256((:n::text || 'i')::bytea))),
     s AS (UPDATE scans SET status = 'success', finished_at = now(), version = 3,
                            head_hash = sha256((:n::text || 'i')::bytea), updated_at = now() WHERE id = :scan::uuid)
SELECT 1;
COMMIT;
