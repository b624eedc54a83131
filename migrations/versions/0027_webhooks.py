"""Webhooks: notifications to an organisation's HTTP endpoints, from an outbox in PostgreSQL.

``webhook_subscriptions`` holds where an organisation wants to hear of which notifications, and
the secret their signatures use (shown once, at creation; never read back by the API, never in a
log or an event). ``webhook_deliveries`` is the outbox: one row per notification and matching
enabled subscription, inserted in the transaction of the change it reports (a scan finished or
failed, a task failed terminally, a cancellation the worker never acknowledged, a worker gone),
so a notification exists exactly when its change committed. Its ``id`` is the notification id
receivers deduplicate by. A row is due while it is neither delivered nor dead-lettered and its
``next_attempt_at`` has passed; a sender takes it by moving ``next_attempt_at`` past its own
timeout (the claim's lease), so a sender that dies leaves the row due again once that passes;
``claims`` counts the takes and fences a sender's outcome to its own take. ``attempts`` counts
the sends against the subscription's budget (a redelivery starts it again).

``worker_gone_notices`` remembers, per worker, the last sighting a "worker gone" notification was
sent for, so each absence is reported once, whichever Gateway process notices it first.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE webhook_subscriptions (
    id               uuid        PRIMARY KEY,
    organization_id  uuid        NOT NULL REFERENCES organizations (id),
    url              text        NOT NULL CHECK (url ~ '^https?://'),
    secret           text        NOT NULL,
    event_types      text[]      NOT NULL,
    description      text,
    enabled          boolean     NOT NULL DEFAULT true,
    created_by       text        NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);
CREATE INDEX webhook_subscriptions_org_idx ON webhook_subscriptions (organization_id, created_at);

CREATE TABLE webhook_deliveries (
    id                uuid        PRIMARY KEY,
    subscription_id   uuid        NOT NULL REFERENCES webhook_subscriptions (id),
    organization_id   uuid        NOT NULL,
    event_type        text        NOT NULL,
    payload           jsonb       NOT NULL,
    created_at        timestamptz NOT NULL,
    attempts          integer     NOT NULL DEFAULT 0,
    claims            integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL,
    last_attempt_at   timestamptz,
    last_status       integer,
    last_error        text,
    delivered_at      timestamptz,
    dead_lettered_at  timestamptz
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND dead_lettered_at IS NULL;
CREATE INDEX webhook_deliveries_subscription_idx ON webhook_deliveries (subscription_id, created_at);

CREATE TABLE worker_gone_notices (
    worker_id     uuid        PRIMARY KEY,
    last_seen_at  timestamptz NOT NULL,
    noticed_at    timestamptz NOT NULL
);
GRANT SELECT, INSERT, UPDATE ON webhook_subscriptions, webhook_deliveries, worker_gone_notices TO leasehold_app;
"""

DOWNGRADE = r"""
REVOKE ALL ON webhook_subscriptions, webhook_deliveries, worker_gone_notices FROM leasehold_app;
DROP TABLE worker_gone_notices;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_subscriptions;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
