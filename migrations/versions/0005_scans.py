"""Scan profiles and centralized result ingestion.

``scans.profile`` is a projection of ``ScanProfileSet``. The ingestion tables (``assets``,
``threats``, ``threat_detections``, ``file_records``, ``exposure_changes``, ``raw_outputs``) are
NOT projections of the event log: they are written by an idempotent ingestion step that runs
inside the result-batch acceptance transaction, only when the batch is newly accepted, keyed by
the batch id (and record index) so that running it again for the same batch adds nothing.
``replay rebuild`` does not reproduce them (it rebuilds projections only); the inputs they are
derived from (``worker_result_batches`` + the immutable, content-addressed ``result_payloads``)
are kept, so they can be re-derived by re-running ingestion per batch.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE scans ADD COLUMN profile jsonb;

CREATE TABLE assets (
    id               uuid PRIMARY KEY,
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    kind             text NOT NULL,
    value            text NOT NULL,
    attributes       jsonb NOT NULL DEFAULT '{}'::jsonb,
    first_seen_at    timestamptz NOT NULL,
    last_seen_at     timestamptz NOT NULL,
    first_batch_id   uuid NOT NULL,
    UNIQUE (organization_id, kind, value)
);

-- Which scan (job) saw which asset: the scan-scoped read model.
CREATE TABLE asset_sightings (
    asset_id         uuid NOT NULL REFERENCES assets (id),
    scan_job_id      uuid NOT NULL REFERENCES scan_jobs (id),
    scan_id          uuid NOT NULL REFERENCES scans (id),
    first_seen_at    timestamptz NOT NULL,
    PRIMARY KEY (asset_id, scan_job_id)
);
CREATE INDEX asset_sightings_scan_idx ON asset_sightings (scan_id);

CREATE TABLE threats (
    id               uuid PRIMARY KEY,
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    external_id      text NOT NULL DEFAULT '',
    title            text NOT NULL DEFAULT '',
    severity         text NOT NULL DEFAULT '',
    data             jsonb NOT NULL,
    first_seen_at    timestamptz NOT NULL,
    last_seen_at     timestamptz NOT NULL,
    batch_id         uuid NOT NULL,
    record_index     integer NOT NULL,
    UNIQUE (batch_id, record_index)
);
CREATE UNIQUE INDEX threats_external_idx ON threats (organization_id, external_id) WHERE external_id <> '';

CREATE TABLE threat_detections (
    threat_id        uuid NOT NULL REFERENCES threats (id),
    scan_job_id      uuid NOT NULL REFERENCES scan_jobs (id),
    scan_id          uuid NOT NULL REFERENCES scans (id),
    batch_id         uuid NOT NULL,
    detected_at      timestamptz NOT NULL,
    PRIMARY KEY (threat_id, scan_job_id)
);
"""

_KEYED = """
CREATE TABLE {name} (
    batch_id         uuid NOT NULL REFERENCES worker_result_batches (id),
    record_index     integer NOT NULL,
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    scan_id          uuid NOT NULL REFERENCES scans (id),
    scan_job_id      uuid NOT NULL REFERENCES scan_jobs (id),
    data             jsonb NOT NULL,
    recorded_at      timestamptz NOT NULL,
    PRIMARY KEY (batch_id, record_index)
);
"""

TABLES = ("assets", "asset_sightings", "threats", "threat_detections", "file_records", "exposure_changes",
          "raw_outputs")

GRANTS = f"""
GRANT SELECT, INSERT, UPDATE ON {", ".join(TABLES)} TO leasehold_app;
GRANT SELECT ON {", ".join(TABLES)} TO leasehold_analyst;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    for name in ("file_records", "exposure_changes", "raw_outputs"):
        op.execute(_KEYED.format(name=name))
    op.execute(GRANTS)


def downgrade() -> None:
    for name in reversed(TABLES):
        op.execute(f"DROP TABLE {name}")
    op.execute("ALTER TABLE scans DROP COLUMN profile")
