-- Pages of tasks' scopes (see domain/scopes.py): content-addressed and immutable, like result
-- payloads. A task's row lists the sha256s of its scope's stored pages in order
-- (worker_tasks.scope_pages, a projection of TaskCreated); page 0 is the row's own scope.

-- name: scope_pages_store
-- Every stored page of one new scope, in the transaction that creates its task. The same page
-- stored twice (a scan's scope keeps its earlier pages from step to step) is one row: a page that
-- is already there is not written again (the conflict is found in the key's index, before the
-- new body is). The bodies travel in binary (the b placeholder): as text a bytea array is hex,
-- twice the bytes, and parsing it cost ten times the insert (bench/scopes.py).
INSERT INTO scope_pages (sha256, body)
SELECT u.sha256, u.body FROM unnest(%(sha256s)s::text[], %(bodies)b::bytea[]) AS u (sha256, body)
ON CONFLICT (sha256) DO NOTHING

-- name: scope_page_of_task
-- One page of a task's scope, for the worker that holds its attempt (checked by the caller, from
-- task_read_for_write in the same round trip): page 0 is the assets of the row's own scope, page
-- n (from 1) the n-th stored page (NULL when the row lists no such page, or it is missing).
SELECT CASE WHEN %(page)s::int = 0 THEN t.scope -> 'assets' END AS inline_assets,
       t.scope_pages[%(page)s::int] AS sha256, p.body
FROM worker_tasks t
LEFT JOIN scope_pages p ON %(page)s::int >= 1 AND p.sha256 = t.scope_pages[%(page)s::int]
WHERE t.id = %(task_id)s

-- name: scope_pages_damaged
-- replay verify: every stored page that tasks refer to and that is missing (NULL), or whose bytes
-- no longer hash to its key (their hash), of the listed tasks (every task when task_ids is NULL).
-- The hash is computed in the database: no page body travels.
SELECT u.sha256, encode(sha256(p.body), 'hex') AS computed
FROM (SELECT DISTINCT x.sha256
      FROM worker_tasks t CROSS JOIN LATERAL unnest(t.scope_pages) AS x (sha256)
      WHERE %(task_ids)s::uuid[] IS NULL OR t.id = ANY(%(task_ids)s::uuid[])) u
LEFT JOIN scope_pages p ON p.sha256 = u.sha256
WHERE p.sha256 IS NULL OR encode(sha256(p.body), 'hex') <> p.sha256
ORDER BY u.sha256
