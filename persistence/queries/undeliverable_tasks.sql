-- name: undeliverable_tasks_listed
-- The tasks migration 0022 listed (stored before the input limits, breaking them), oldest listing
-- first; read outside any transaction, each then ended in one of its own.
SELECT task_id FROM undeliverable_tasks ORDER BY listed_at, task_id LIMIT %(limit)s

-- name: undeliverable_task_unlist
-- Take one task off the list, first thing in the transaction that ends it: the row lock makes a
-- second Gateway starting at the same time wait, then find it gone (no row: nothing to do).
DELETE FROM undeliverable_tasks WHERE task_id = %(task_id)s RETURNING task_id
