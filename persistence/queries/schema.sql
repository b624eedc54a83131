-- name: schema_migrated
-- Whether the schema was ever migrated (alembic's version table exists).
SELECT to_regclass('public.alembic_version') IS NOT NULL AS migrated

-- name: schema_revision
-- The alembic revision the schema is at (read only when schema_migrated says the table exists).
SELECT version_num FROM alembic_version
