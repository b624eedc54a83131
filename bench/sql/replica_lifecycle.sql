-- leasehold's lifecycle in pure SQL, for pgbench: the same statements and rows the service layer
-- sends (create_task -> acquire -> complete carrying the final batch), with no client work at all:
-- no decision, no serialisation, no hashing (hashes are sha256 of a counter), states of the size
-- the real events have. What PostgreSQL alone needs for our rows: the second yardstick of
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
-- acquire: lock the worker, count its live attempts, take the head of its queue, one combined write
BEGIN;
SELECT id, enabled, revoked_at, max_concurrent_tasks FROM workers WHERE id = :worker::uuid FOR UPDATE;
SELECT count(*), clock_timestamp() FROM worker_task_attempts
WHERE worker_id = :worker::uuid AND status IN ('leased', 'running');
SELECT t.id AS task, t.scan_job_id AS job, t.scan_id AS scan FROM worker_tasks t
WHERE t.state IN ('pending', 'retry_wait') AND t.organization_id = :org::uuid AND t.available_at <= now()
ORDER BY t.priority DESC, t.created_at LIMIT 1 FOR UPDATE SKIP LOCKED \gset
WITH e AS (INSERT INTO events (originator_id, originator_version, topic, state, prev_hash, hash) VALUES
        (:task::uuid, 2, 'domain.events' || chr(58) || 'TaskLeased', convert_to(repeat('x', 533), 'UTF8'),
         sha256((:n::text || 'd')::bytea), sha256((:n::text || 'e')::bytea))),
     t AS (UPDATE worker_tasks SET state = 'leased', attempt_count = 1, current_attempt_id = md5('attempt' || :n::text)::uuid,
                                   version = 2, head_hash = sha256((:n::text || 'e')::bytea), updated_at = now()
           WHERE id = :task::uuid),
     a AS (INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status,
                                             leased_at, lease_expires_at, deadline_at, batch_count,
                                             final_batch_accepted)
           VALUES (md5('attempt' || :n::text)::uuid, :task::uuid, :worker::uuid, 1, sha256((:n::text || 'token')::bytea), 'leased',
                   now(), now() + interval '60 seconds', now() + interval '600 seconds', 0, false)),
     j AS (UPDATE scan_jobs SET status = 'running', started_at = now(), updated_at = now() WHERE id = :job::uuid),
     s AS (UPDATE scans SET status = 'running', updated_at = now() WHERE id = :scan::uuid AND status = 'pending')
SELECT 1;
COMMIT;
-- complete carrying the final batch: lock and read the task, the combined write, the batch's
-- asset, then settle the scan (lock, jobs summary, the scan's combined write)
BEGIN;
SELECT id FROM worker_tasks WHERE id = :task::uuid FOR UPDATE;
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
                                           batch_count = 1, final_batch_accepted = true
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
