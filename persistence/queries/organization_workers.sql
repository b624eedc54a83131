-- name: worker_assignments
-- After worker_lock, as its own statement: every organisation assignment of the worker.
SELECT ow.organization_id, ow.enabled, ow.revoked_at IS NOT NULL AS revoked
FROM organization_workers ow
WHERE ow.worker_id = %(worker_id)s

-- name: assignments_of_workers
-- Operator API: the assignments of a page of workers; an organisation key sees only its own
-- organisation's, never which other organisations a shared worker serves.
SELECT ow.worker_id, ow.organization_id, ow.enabled, ow.revoked_at, ow.created_at, ow.updated_at
FROM organization_workers ow
WHERE ow.worker_id = ANY(%(worker_ids)s::uuid[])
  AND (%(organization_id)s::uuid IS NULL OR ow.organization_id = %(organization_id)s::uuid)
ORDER BY ow.worker_id, ow.organization_id
