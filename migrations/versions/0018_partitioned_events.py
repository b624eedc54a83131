"""The event log partitioned by time (``recorded_at``), and the register of archived partitions.

``events`` becomes a range-partitioned table. The existing table is attached as its first
partition (``events_p_initial``, from MINVALUE to the first day of next month): no row is
copied. Later partitions are created ahead of time, one month each by default, by
``events_ensure_partitions(span, ahead)`` (the Gateway's partitions loop and ``leasehold
partitions ensure`` call it); a default partition (``events_p_default``) takes any row for
which no partition exists yet, so an insert never fails for lack of one.

What partitioning changes, and what keeps each guarantee:

* PostgreSQL requires every unique constraint of a partitioned table to include the partition
  key, so ``(originator_id, originator_version)`` and ``notification_id`` can no longer be
  unique across the whole table. Every partition has both as its own unique keys (the
  primary key and a unique index, created with the partition). Across partitions, a stream's
  versions stay unique because every append runs under the stream's row lock and computes the
  version from the stream's head read under it (invariant 2); ``notification_id`` comes from
  one sequence. A racing append that did slip past the lock within a partition is still
  refused by the partition's key.
* Append-only: the row triggers ``events_no_update``/``events_no_delete`` on the parent are
  cloned by PostgreSQL onto every partition, present and future; TRUNCATE triggers are not,
  so ``events_create_partition`` gives each new partition its own ``events_no_truncate``. The
  application role is granted SELECT and INSERT on the parent only (it reaches partitions
  through it) and has no privilege on any partition.
* Retention (``leasehold retention run``) is the one way a partition leaves: by the owner,
  after the partition was exported as a signed archive and that archive verified; it detaches
  and drops the partition in the transaction that records the archive's manifest digest in
  ``event_archives`` (append-only, like the log), so a verifier knows which range is archived
  and which archive to ask for.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- The current table becomes the first partition: its keys stay (they are the partition's own),
-- its row triggers are replaced by the parent's clones, its TRUNCATE trigger stays.
ALTER TABLE events RENAME TO events_p_initial;
ALTER TABLE events_p_initial RENAME CONSTRAINT events_pkey TO events_p_initial_pkey;
ALTER TABLE events_p_initial RENAME CONSTRAINT events_notification_id_key TO events_p_initial_notification_id_key;
ALTER INDEX events_transaction_idx RENAME TO events_p_initial_transaction_id_notification_id_idx;
DROP TRIGGER events_no_update ON events_p_initial;
DROP TRIGGER events_no_delete ON events_p_initial;
REVOKE ALL ON events_p_initial FROM leasehold_app;

CREATE TABLE events (
    originator_id       uuid NOT NULL,
    originator_version  version_number NOT NULL,
    topic               text NOT NULL,
    state               bytea NOT NULL,
    notification_id     bigint NOT NULL DEFAULT nextval('events_notification_id_seq'),
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    transaction_id      xid8 NOT NULL DEFAULT pg_current_xact_id(),
    prev_hash           sha256_digest NOT NULL,
    hash                sha256_digest NOT NULL
) PARTITION BY RANGE (recorded_at);
ALTER SEQUENCE events_notification_id_seq OWNED BY events.notification_id;
CREATE INDEX events_transaction_idx ON events (transaction_id, notification_id);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();
GRANT SELECT, INSERT ON events TO leasehold_app;

ALTER TABLE events ATTACH PARTITION events_p_initial
    FOR VALUES FROM (MINVALUE) TO (date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 month');

-- The views over the log now read the partitioned table (same columns, so grants and views
-- built on them stay).
CREATE OR REPLACE VIEW analyst_events AS
SELECT e.notification_id,
       e.originator_id,
       e.originator_version,
       split_part(e.topic, ':', 2)                        AS event_type,
       e.recorded_at,
       (s.state ->> 'timestamp')::timestamptz             AS occurred_at,
       s.state ->> 'actor'                                AS actor,
       s.state - 'lease_token_hash' - 'timestamp' - 'actor' AS data
FROM events e
CROSS JOIN LATERAL (SELECT convert_from(e.state, 'UTF8')::jsonb AS state) s;

-- Every partition of the log with its range (lower NULL: from the beginning; both NULL: the
-- default partition).
CREATE VIEW event_partitions AS
SELECT c.relname::text AS name,
       CASE WHEN b.bound ~ '^FOR VALUES FROM \(MINVALUE\)' OR b.bound = 'DEFAULT' THEN NULL
            ELSE substring(b.bound FROM 'FROM \(''([^'']*)''\)')::timestamptz END AS lower_bound,
       CASE WHEN b.bound = 'DEFAULT' THEN NULL
            ELSE substring(b.bound FROM 'TO \(''([^'']*)''\)')::timestamptz END AS upper_bound,
       b.bound = 'DEFAULT' AS is_default
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
WHERE i.inhparent = 'events'::regclass;

-- A new partition [lo, hi): its own unique keys and TRUNCATE trigger, then attached (which
-- takes only a SHARE UPDATE EXCLUSIVE lock on the log: appends go on). Owner's rights, so the
-- application role may call it and nothing else.
CREATE FUNCTION events_create_partition(lo timestamptz, hi timestamptz) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    name text := 'events_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
BEGIN
    IF hi <= lo THEN
        RAISE EXCEPTION 'partition bounds out of order: % to %', lo, hi;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE events INCLUDING DEFAULTS)', name);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (originator_id, originator_version)', name);
    EXECUTE format('ALTER TABLE %I ADD UNIQUE (notification_id)', name);
    EXECUTE format('CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON %I'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change()', name);
    EXECUTE format('ALTER TABLE events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name, lo, hi);
    RETURN name;
END
$$;

-- Partitions of ``span`` each, after the last one, until the log is covered up to now() +
-- ahead; the names of those created. Rows that already went to the default partition are
-- left there: a new partition starts after the newest of them.
CREATE FUNCTION events_ensure_partitions(span interval DEFAULT interval '1 month',
                                         ahead interval DEFAULT interval '2 months')
RETURNS SETOF text LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    lo timestamptz;
    overflow timestamptz;
BEGIN
    IF span <= interval '0' OR ahead < interval '0' THEN
        RAISE EXCEPTION 'span must be positive and ahead not negative (got % and %)', span, ahead;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('leasehold.events_ensure_partitions'));
    SELECT coalesce(max(upper_bound), date_trunc('day', now())) INTO lo FROM event_partitions WHERE NOT is_default;
    SELECT max(recorded_at) INTO overflow FROM events_p_default;
    IF overflow IS NOT NULL AND overflow >= lo THEN
        lo := overflow + interval '1 microsecond';
    END IF;
    WHILE lo < now() + ahead LOOP
        RETURN NEXT events_create_partition(lo, lo + span);
        lo := lo + span;
    END LOOP;
END
$$;

CREATE TABLE events_p_default PARTITION OF events DEFAULT;
ALTER TABLE events_p_default ADD PRIMARY KEY (originator_id, originator_version);
ALTER TABLE events_p_default ADD UNIQUE (notification_id);
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events_p_default
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();

REVOKE ALL ON FUNCTION events_create_partition(timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION events_ensure_partitions(interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION events_ensure_partitions(interval, interval) TO leasehold_app;
GRANT SELECT ON event_partitions TO leasehold_app, leasehold_analyst;

-- The register of archived partitions: which range left the live log, into which archive
-- (the sha256 of its manifest.json, signed by key_id). Append-only like the log.
CREATE TABLE event_archives (
    id                     bigserial PRIMARY KEY,
    partition_name         text NOT NULL,
    lower_bound            timestamptz,
    upper_bound            timestamptz NOT NULL,
    events                 bigint NOT NULL CHECK (events >= 0),
    streams                bigint NOT NULL CHECK (streams >= 0),
    first_notification_id  bigint,
    last_notification_id   bigint,
    manifest_sha256        text NOT NULL UNIQUE CHECK (manifest_sha256 ~ '^[0-9a-f]{64}$'),
    key_id                 text NOT NULL,
    archived_at            timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER event_archives_no_update BEFORE UPDATE ON event_archives
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER event_archives_no_delete BEFORE DELETE ON event_archives
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER event_archives_no_truncate BEFORE TRUNCATE ON event_archives
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();
GRANT SELECT ON event_archives TO leasehold_app, leasehold_analyst;
"""

DOWNGRADE = r"""
DROP TABLE event_archives;
DROP VIEW event_partitions;
DROP FUNCTION events_ensure_partitions(interval, interval);
DROP FUNCTION events_create_partition(timestamptz, timestamptz);

-- The NOT NULL constraints are named as 0017 left them: PostgreSQL 18 records NOT NULL as named
-- constraints and, while events_partitioned still holds those names, would otherwise choose
-- events_*_not_null1/2 (PostgreSQL 15 accepts the names and keeps none).
ALTER TABLE events RENAME TO events_partitioned;
CREATE TABLE events (
    originator_id       uuid CONSTRAINT events_originator_id_not_null NOT NULL,
    originator_version  version_number CONSTRAINT events_originator_version_not_null NOT NULL,
    topic               text CONSTRAINT events_topic_not_null NOT NULL,
    state               bytea CONSTRAINT events_state_not_null NOT NULL,
    notification_id     bigint CONSTRAINT events_notification_id_not_null NOT NULL DEFAULT nextval('events_notification_id_seq'),
    recorded_at         timestamptz CONSTRAINT events_recorded_at_not_null NOT NULL DEFAULT clock_timestamp(),
    transaction_id      xid8 CONSTRAINT events_transaction_id_not_null NOT NULL DEFAULT pg_current_xact_id(),
    prev_hash           sha256_digest CONSTRAINT events_prev_hash_not_null NOT NULL,
    hash                sha256_digest CONSTRAINT events_hash_not_null NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (originator_id, originator_version),
    CONSTRAINT events_notification_id_key UNIQUE (notification_id)
);
INSERT INTO events SELECT * FROM events_partitioned ORDER BY notification_id;
ALTER SEQUENCE events_notification_id_seq OWNED BY events.notification_id;
CREATE OR REPLACE VIEW analyst_events AS
SELECT e.notification_id,
       e.originator_id,
       e.originator_version,
       split_part(e.topic, ':', 2)                        AS event_type,
       e.recorded_at,
       (s.state ->> 'timestamp')::timestamptz             AS occurred_at,
       s.state ->> 'actor'                                AS actor,
       s.state - 'lease_token_hash' - 'timestamp' - 'actor' AS data
FROM events e
CROSS JOIN LATERAL (SELECT convert_from(e.state, 'UTF8')::jsonb AS state) s;
DROP TABLE events_partitioned;
CREATE INDEX events_transaction_idx ON events (transaction_id, notification_id);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();
GRANT SELECT, INSERT ON events TO leasehold_app;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
