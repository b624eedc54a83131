-- Webhooks (migration 0027): subscriptions, and the outbox of notifications to deliver.
-- A delivery is due while neither delivered nor dead-lettered and next_attempt_at has passed.

-- name: webhook_subscription_insert
INSERT INTO webhook_subscriptions (id, organization_id, url, secret, event_types, description, created_by,
                                   created_at, updated_at)
VALUES (%(id)s, %(organization_id)s, %(url)s, %(secret)s, %(event_types)s, %(description)s, %(created_by)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))

-- name: webhook_subscription_get
-- Never the secret: it is shown once, in the answer to its creation.
SELECT id, organization_id, url, event_types, description, enabled, created_by, created_at, updated_at
FROM webhook_subscriptions
WHERE id = %(subscription_id)s

-- name: webhook_subscriptions_list
-- An organisation key sees its own (organization_id set), an administrator every one.
SELECT id, organization_id, url, event_types, description, enabled, created_by, created_at, updated_at
FROM webhook_subscriptions
WHERE (%(organization_id)s::uuid IS NULL OR organization_id = %(organization_id)s::uuid)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: webhook_subscriptions_enabled
-- Whether any subscription is enabled: without one, a sender has nothing to do (and runs nothing else).
SELECT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE enabled) AS enabled

-- name: webhook_subscription_disable
UPDATE webhook_subscriptions SET enabled = false, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(subscription_id)s AND enabled

-- name: webhook_deliveries_dead_letter_subscription
-- A disabled subscription's pending deliveries end as dead letters: kept on the record, never sent.
UPDATE webhook_deliveries
   SET dead_lettered_at = coalesce(%(now)s::timestamptz, now()), last_error = 'the subscription was disabled'
 WHERE subscription_id = %(subscription_id)s AND delivered_at IS NULL AND dead_lettered_at IS NULL

-- name: webhook_deliveries_enqueue
-- The outbox row of a notification, one per enabled subscription of the organisation that wants
-- this event type; queued in the transaction of the change it reports.
INSERT INTO webhook_deliveries (id, subscription_id, organization_id, event_type, payload, created_at,
                                next_attempt_at)
SELECT gen_random_uuid(), s.id, s.organization_id, %(event_type)s, %(payload)s::jsonb,
       coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now())
FROM webhook_subscriptions s
WHERE s.organization_id = %(organization_id)s AND s.enabled AND %(event_type)s = ANY(s.event_types)

-- name: webhook_delivery_insert
-- One delivery to one subscription (the test ping).
INSERT INTO webhook_deliveries (id, subscription_id, organization_id, event_type, payload, created_at,
                                next_attempt_at)
VALUES (%(id)s, %(subscription_id)s, %(organization_id)s, %(event_type)s, %(payload)s::jsonb,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))

-- name: worker_gone_notice
-- Workers last seen longer than idle_seconds ago (and not revoked: a revoked worker is meant to
-- be gone) whose absence was not reported yet: remember it (worker_gone_notices), and queue a
-- "worker.gone" notification to each organisation the worker is assigned to, in this one
-- statement. Two processes noticing at once: the second one's insert waits for the first's row
-- and then finds the absence reported (the WHERE of the conflict), so it is reported once.
WITH gone AS (
    SELECT p.worker_id, greatest(p.last_poll_at, p.last_renew_at, p.last_write_at) AS last_seen_at
    FROM worker_presence p
    JOIN workers w ON w.id = p.worker_id
    WHERE w.revoked_at IS NULL
      AND greatest(p.last_poll_at, p.last_renew_at, p.last_write_at)
          < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(idle_seconds)s)
), noticed AS (
    INSERT INTO worker_gone_notices AS n (worker_id, last_seen_at, noticed_at)
    SELECT worker_id, last_seen_at, coalesce(%(now)s::timestamptz, now()) FROM gone ORDER BY worker_id
    ON CONFLICT (worker_id) DO UPDATE SET last_seen_at = excluded.last_seen_at, noticed_at = excluded.noticed_at
    WHERE n.last_seen_at < excluded.last_seen_at
    RETURNING n.worker_id, n.last_seen_at
), queued AS (
    INSERT INTO webhook_deliveries (id, subscription_id, organization_id, event_type, payload, created_at,
                                    next_attempt_at)
    SELECT gen_random_uuid(), s.id, s.organization_id, 'worker.gone',
           jsonb_build_object('worker_id', w.id, 'name', w.name, 'last_seen_at', noticed.last_seen_at,
                              'gone_after_seconds', %(idle_seconds)s),
           coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now())
    FROM noticed
    JOIN workers w ON w.id = noticed.worker_id
    JOIN organization_workers ow ON ow.worker_id = noticed.worker_id AND ow.revoked_at IS NULL
    JOIN webhook_subscriptions s ON s.organization_id = ow.organization_id AND s.enabled
                                AND 'worker.gone' = ANY(s.event_types)
    RETURNING id
)
SELECT (SELECT count(*) FROM noticed) AS workers, (SELECT count(*) FROM queued) AS notifications

-- name: webhook_deliveries_claim
-- Take up to `limit` due deliveries for this sender: SKIP LOCKED so racing senders take disjoint
-- rows, and next_attempt_at moved past the sender's timeout (the claim's lease) so no other sender
-- takes them while this one sends; a sender that dies leaves them due again once it passes.
-- `claims` is the fencing token of the take: an outcome is recorded only by the take it belongs to.
-- A disabled subscription's rows are never taken (one queued while it was being disabled stays
-- pending, on the record: never sent after the subscription was disabled).
UPDATE webhook_deliveries d
   SET next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s),
       attempts = d.attempts + 1,
       claims = d.claims + 1,
       last_attempt_at = coalesce(%(now)s::timestamptz, now())
  FROM webhook_subscriptions s
 WHERE d.id = ANY(ARRAY(SELECT due.id FROM webhook_deliveries due
                         WHERE due.delivered_at IS NULL AND due.dead_lettered_at IS NULL
                           AND due.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
                           AND EXISTS (SELECT 1 FROM webhook_subscriptions live
                                        WHERE live.id = due.subscription_id AND live.enabled)
                         ORDER BY due.next_attempt_at
                         LIMIT %(limit)s
                         FOR UPDATE OF due SKIP LOCKED))
   AND s.id = d.subscription_id
RETURNING d.id, d.subscription_id, d.organization_id, d.event_type, d.payload, d.created_at, d.attempts,
          d.claims, s.url, s.secret

-- name: webhook_deliveries_delivered
-- A sender's batch of 2xx answers, in one statement; each row only if it is still that sender's
-- take (claims) and not ended meanwhile.
UPDATE webhook_deliveries d
   SET delivered_at = coalesce(%(now)s::timestamptz, now()), last_status = u.status, last_error = NULL
  FROM unnest(%(ids)s::uuid[], %(claims)s::int[], %(statuses)s::int[]) AS u(id, claims, status)
 WHERE d.id = u.id AND d.claims = u.claims AND d.delivered_at IS NULL AND d.dead_lettered_at IS NULL

-- name: webhook_deliveries_failed
-- A sender's batch of failed sends: each due again after its backoff, or a dead letter once its
-- attempts are spent.
UPDATE webhook_deliveries d
   SET last_status = u.status, last_error = u.error,
       next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => u.retry_seconds),
       dead_lettered_at = CASE WHEN d.attempts >= %(max_attempts)s THEN coalesce(%(now)s::timestamptz, now()) END
  FROM unnest(%(ids)s::uuid[], %(claims)s::int[], %(statuses)s::int[], %(errors)s::text[],
              %(retry_seconds)s::float8[]) AS u(id, claims, status, error, retry_seconds)
 WHERE d.id = u.id AND d.claims = u.claims AND d.delivered_at IS NULL AND d.dead_lettered_at IS NULL

-- name: webhook_delivery_redeliver
-- Due again now, with a fresh budget of attempts; same id, so receivers still deduplicate it.
UPDATE webhook_deliveries
   SET delivered_at = NULL, dead_lettered_at = NULL, attempts = 0,
       next_attempt_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND subscription_id = %(subscription_id)s

-- name: webhook_delivery_get
SELECT id, subscription_id, organization_id, event_type, payload, created_at, attempts, next_attempt_at,
       last_attempt_at, last_status, last_error, delivered_at, dead_lettered_at
FROM webhook_deliveries
WHERE id = %(id)s AND subscription_id = %(subscription_id)s

-- name: webhook_deliveries_list
-- A subscription's deliveries, newest first; state: pending, delivered, dead (NULL: all).
SELECT id, subscription_id, organization_id, event_type, payload, created_at, attempts, next_attempt_at,
       last_attempt_at, last_status, last_error, delivered_at, dead_lettered_at
FROM webhook_deliveries
WHERE subscription_id = %(subscription_id)s
  AND (%(state)s::text IS NULL
       OR (%(state)s = 'pending' AND delivered_at IS NULL AND dead_lettered_at IS NULL)
       OR (%(state)s = 'delivered' AND delivered_at IS NOT NULL)
       OR (%(state)s = 'dead' AND dead_lettered_at IS NOT NULL))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s
