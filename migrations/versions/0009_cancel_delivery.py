"""Cancellation on the record: when a cancel reached the worker, and how long each leg took.

``worker_tasks`` gains the projection of ``CancelDelivered`` (the first time the cancellation
was handed to the worker, and on which channel: ``renew`` or ``long-poll``) and the time the
worker acknowledged it (a ``TaskCancelled`` by ``cancel-ack``; a cancellation the Gateway ended
itself after the grace period has none).

Two analyst views:

* ``cancellation_deliveries``: one row per task whose running attempt was asked to stop:
  request -> delivery (with channel) -> acknowledgement or termination, with both legs in seconds;
* ``cancellation_latency_by_organization``: per organisation, counts and the two legs
  (request -> delivery, delivery -> acknowledgement) as mean, median, p95 and max.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE DOMAIN cancel_channel AS text CHECK (VALUE IN ('renew', 'long-poll'));
ALTER TABLE worker_tasks
    ADD COLUMN cancel_delivered_at timestamptz,
    ADD COLUMN cancel_delivery_channel cancel_channel,
    ADD COLUMN cancel_acknowledged_at timestamptz;

-- A task whose live attempt was asked to stop (not one cancelled before any lease): the three
-- moments of its cancellation and the two legs between them.
CREATE VIEW cancellation_deliveries AS
SELECT t.id AS task_id, t.organization_id, t.scan_id, t.task_type, t.state,
       a.id AS attempt_id, a.worker_id,
       t.cancel_requested_at,
       t.cancel_delivered_at,
       t.cancel_delivery_channel                                                AS delivery_channel,
       t.cancel_acknowledged_at,
       CASE WHEN t.state = 'cancelled' THEN t.finished_at END                   AS cancelled_at,
       CASE WHEN t.state <> 'cancelled' THEN NULL
            WHEN t.cancel_acknowledged_at IS NOT NULL THEN 'acknowledged'
            ELSE 'terminated' END                                               AS ended_by,
       extract(epoch FROM t.cancel_delivered_at - t.cancel_requested_at)::float8    AS request_to_delivery_seconds,
       extract(epoch FROM t.cancel_acknowledged_at - t.cancel_delivered_at)::float8 AS delivery_to_ack_seconds,
       extract(epoch FROM CASE WHEN t.state = 'cancelled' THEN t.finished_at END
                          - t.cancel_requested_at)::float8                      AS request_to_end_seconds
FROM worker_tasks t
JOIN worker_task_attempts a ON a.id = t.current_attempt_id
WHERE t.cancel_requested_at IS NOT NULL
  AND (t.state = 'cancelling' OR (t.state = 'cancelled' AND a.status = 'cancelled'));

-- Per organisation: how fast a cancel reaches the worker, and how fast the worker then stops.
CREATE VIEW cancellation_latency_by_organization AS
SELECT organization_id,
       count(*)                                              AS cancellations,
       count(cancel_delivered_at)                            AS delivered,
       count(*) FILTER (WHERE delivery_channel = 'renew')     AS delivered_on_renew,
       count(*) FILTER (WHERE delivery_channel = 'long-poll') AS delivered_on_long_poll,
       count(*) FILTER (WHERE ended_by = 'acknowledged')     AS acknowledged,
       count(*) FILTER (WHERE ended_by = 'terminated')       AS terminated,
       avg(request_to_delivery_seconds)                      AS request_to_delivery_mean_seconds,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY request_to_delivery_seconds)
                                                             AS request_to_delivery_p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY request_to_delivery_seconds)
                                                             AS request_to_delivery_p95_seconds,
       max(request_to_delivery_seconds)                      AS request_to_delivery_max_seconds,
       avg(delivery_to_ack_seconds)                          AS delivery_to_ack_mean_seconds,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY delivery_to_ack_seconds)
                                                             AS delivery_to_ack_p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY delivery_to_ack_seconds)
                                                             AS delivery_to_ack_p95_seconds,
       max(delivery_to_ack_seconds)                          AS delivery_to_ack_max_seconds
FROM cancellation_deliveries
GROUP BY organization_id;

GRANT SELECT ON cancellation_deliveries, cancellation_latency_by_organization TO leasehold_analyst;
"""

DOWNGRADE = r"""
DROP VIEW cancellation_latency_by_organization;
DROP VIEW cancellation_deliveries;
ALTER TABLE worker_tasks
    DROP COLUMN cancel_acknowledged_at,
    DROP COLUMN cancel_delivery_channel,
    DROP COLUMN cancel_delivered_at;
DROP DOMAIN cancel_channel;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
