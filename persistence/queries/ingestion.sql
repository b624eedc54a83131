-- Centralized ingestion: run in the batch acceptance transaction, once per newly
-- accepted batch. Every statement is idempotent for a given (batch_id, record_index).

-- name: ingest_assets
-- Every asset of one batch (distinct kind and value: the caller merges repeats) and its sighting
-- by the batch's job, with the asset's kind and value (a scan's next scope reads its sightings
-- alone: scan_found_assets). attributes merge into what earlier batches reported.
WITH a AS (
    INSERT INTO assets (id, organization_id, kind, value, attributes, first_seen_at, last_seen_at,
                        first_batch_id)
    SELECT u.id, %(organization_id)s, u.kind, u.value, u.attributes, %(now)s, %(now)s, %(batch_id)s
    FROM unnest(%(ids)s::uuid[], %(kinds)s::text[], %(values)s::text[], %(attributes)s::jsonb[])
         AS u(id, kind, value, attributes)
    ON CONFLICT (organization_id, kind, value) DO UPDATE
        SET last_seen_at = greatest(assets.last_seen_at, excluded.last_seen_at),
            attributes = assets.attributes || excluded.attributes
    RETURNING id, kind, value
)
INSERT INTO asset_sightings (asset_id, scan_job_id, scan_id, first_seen_at, kind, value)
SELECT a.id, %(scan_job_id)s, %(scan_id)s, %(now)s, a.kind, a.value FROM a
ON CONFLICT (asset_id, scan_job_id) DO NOTHING

-- name: ingest_threat_external
INSERT INTO threats (id, organization_id, external_id, title, severity, data, first_seen_at, last_seen_at,
                     batch_id, record_index)
VALUES (%(id)s, %(organization_id)s, %(external_id)s, %(title)s, %(severity)s, %(data)s, %(now)s, %(now)s,
        %(batch_id)s, %(record_index)s)
ON CONFLICT (organization_id, external_id) WHERE external_id <> '' DO UPDATE
    SET last_seen_at = greatest(threats.last_seen_at, excluded.last_seen_at),
        title = excluded.title, severity = excluded.severity, data = excluded.data
RETURNING id

-- name: ingest_threat_anonymous
-- No external id: one row per (batch, record); a replay of the batch finds the same row.
WITH ins AS (
    INSERT INTO threats (id, organization_id, external_id, title, severity, data, first_seen_at,
                         last_seen_at, batch_id, record_index)
    VALUES (%(id)s, %(organization_id)s, '', %(title)s, %(severity)s, %(data)s, %(now)s, %(now)s,
            %(batch_id)s, %(record_index)s)
    ON CONFLICT (batch_id, record_index) DO NOTHING
    RETURNING id
)
SELECT id FROM ins
UNION ALL
SELECT id FROM threats WHERE batch_id = %(batch_id)s AND record_index = %(record_index)s

-- name: ingest_detection
INSERT INTO threat_detections (threat_id, scan_job_id, scan_id, batch_id, detected_at)
VALUES (%(threat_id)s, %(scan_job_id)s, %(scan_id)s, %(batch_id)s, %(now)s)
ON CONFLICT (threat_id, scan_job_id) DO NOTHING

-- name: ingest_file_records
INSERT INTO file_records (batch_id, record_index, organization_id, scan_id, scan_job_id, data, recorded_at)
SELECT %(batch_id)s, u.record_index, %(organization_id)s, %(scan_id)s, %(scan_job_id)s, u.data, %(now)s
FROM unnest(%(record_indexes)s::integer[], %(records)s::jsonb[]) AS u(record_index, data)
ON CONFLICT (batch_id, record_index) DO NOTHING

-- name: ingest_exposure_changes
INSERT INTO exposure_changes (batch_id, record_index, organization_id, scan_id, scan_job_id, data, recorded_at)
SELECT %(batch_id)s, u.record_index, %(organization_id)s, %(scan_id)s, %(scan_job_id)s, u.data, %(now)s
FROM unnest(%(record_indexes)s::integer[], %(records)s::jsonb[]) AS u(record_index, data)
ON CONFLICT (batch_id, record_index) DO NOTHING

-- name: ingest_raw_outputs
INSERT INTO raw_outputs (batch_id, record_index, organization_id, scan_id, scan_job_id, data, recorded_at)
SELECT %(batch_id)s, u.record_index, %(organization_id)s, %(scan_id)s, %(scan_job_id)s, u.data, %(now)s
FROM unnest(%(record_indexes)s::integer[], %(records)s::jsonb[]) AS u(record_index, data)
ON CONFLICT (batch_id, record_index) DO NOTHING
-- name: scan_assets
SELECT a.id, a.kind, a.value, a.attributes, a.first_seen_at, a.last_seen_at
FROM asset_sightings s JOIN assets a ON a.id = s.asset_id
WHERE s.scan_id = %(scan_id)s
GROUP BY a.id
ORDER BY a.kind, a.value
LIMIT %(limit)s

-- name: organization_assets
SELECT a.id, a.kind, a.value, a.attributes, a.first_seen_at, a.last_seen_at
FROM assets a WHERE a.organization_id = %(organization_id)s
ORDER BY a.kind, a.value
LIMIT %(limit)s

-- name: organization_threats
SELECT t.id, t.external_id, t.title, t.severity, t.data, t.first_seen_at, t.last_seen_at
FROM threats t WHERE t.organization_id = %(organization_id)s
ORDER BY t.first_seen_at, t.id
LIMIT %(limit)s
