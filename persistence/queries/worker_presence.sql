-- name: worker_presence_publish
-- A Gateway process publishes what it saw since its last publish: every changed worker in this
-- one statement. The times travel as ages in seconds (the process measures them on its monotonic
-- clock) and become times here, on the database's clock (or the test's). GREATEST keeps each
-- time monotone whichever process publishes last, and ignores a NULL (not seen that way here).
-- Rows are written in worker id order, so two processes publishing overlapping workers wait for
-- each other rather than deadlock. Unknown workers are skipped (no foreign key: see 0020).
INSERT INTO worker_presence AS p (worker_id, last_poll_at, last_renew_at, last_write_at, published_at)
SELECT u.id,
       now.at - make_interval(secs => u.poll_age),
       now.at - make_interval(secs => u.renew_age),
       now.at - make_interval(secs => u.write_age),
       now.at
FROM unnest(%(worker_ids)s::uuid[], %(poll_ages)s::float8[], %(renew_ages)s::float8[], %(write_ages)s::float8[])
       AS u(id, poll_age, renew_age, write_age)
CROSS JOIN (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS at) now
WHERE EXISTS (SELECT 1 FROM workers w WHERE w.id = u.id)
ORDER BY u.id
ON CONFLICT (worker_id) DO UPDATE
SET last_poll_at = greatest(p.last_poll_at, excluded.last_poll_at),
    last_renew_at = greatest(p.last_renew_at, excluded.last_renew_at),
    last_write_at = greatest(p.last_write_at, excluded.last_write_at),
    published_at = excluded.published_at

-- name: workers_presence
-- Operator API: each worker's published presence, and the time to judge it against (the
-- database's clock, or the test's).
SELECT u.id, p.last_poll_at, p.last_renew_at, p.last_write_at, coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM unnest(%(worker_ids)s::uuid[]) AS u(id)
LEFT JOIN worker_presence p ON p.worker_id = u.id
