-- The pure-SQL replica of leasehold's lifecycle (bench/sql/replica_lifecycle.sql): its set-up on a
-- database migrated to head. One organisation and worker per pgbench client (client_id 0..N-1,
-- ids derived from it), and one pending scan per lifecycle to come (ids md5(n)::uuid), as the
-- core benchmark provisions one one-job scan per lifecycle before its timed window.
INSERT INTO organizations (id, name, created_at, updated_at, version, head_hash)
SELECT md5('org' || c)::uuid, 'replica-' || c, now(), now(), 1, sha256(c::text::bytea)
FROM generate_series(0, :clients - 1) c;
INSERT INTO workers (id, name, fingerprint, enabled, max_concurrent_tasks, capabilities, task_types,
                     created_at, updated_at, version, head_hash)
SELECT md5('worker' || c)::uuid, 'replica-' || c, encode(sha256(('worker' || c)::bytea), 'hex'), true, 1000,
       '{}', '{probe}', now(), now(), 1, sha256(c::text::bytea)
FROM generate_series(0, :clients - 1) c;
INSERT INTO organization_workers (organization_id, worker_id, enabled, created_at, updated_at)
SELECT md5('org' || c)::uuid, md5('worker' || c)::uuid, true, now(), now() FROM generate_series(0, :clients - 1) c;
INSERT INTO scans (id, organization_id, status, execution_mode, targets, created_at, updated_at, version, head_hash)
SELECT md5(n::text)::uuid, md5('org' || (n % :clients))::uuid, 'pending', 'gateway',
       '{"hosts": ["bench.example.test"]}', now(), now(), 1, sha256(n::text::bytea)
FROM generate_series(1, :scans) n;
CREATE SEQUENCE replica_lifecycle START 1;
VACUUM ANALYZE;
