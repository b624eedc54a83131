-- Example queries for analysts (role leasehold_analyst). Each runs as that role in
-- tests/replay/test_replay_analyst.py; the documentation's Analyse guide (docs/guides/analyse.md) shows them.

-- name: wait_time_per_plugin
-- How long tasks waited for their first lease, per plugin (task_type), over the last 7 days.
SELECT task_type, count(*) AS tasks,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_seconds)::numeric, 3) AS p50_wait_s,
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_seconds)::numeric, 3) AS p95_wait_s,
       max(wait_seconds) AS max_wait_s
FROM task_wait_times
WHERE first_leased_at IS NOT NULL AND created_at >= now() - interval '7 days'
GROUP BY task_type
ORDER BY p95_wait_s DESC;

-- name: oldest_waiting_tasks
-- Tasks still waiting for their first lease, oldest first.
SELECT task_id, task_type, priority, state, created_at
FROM task_wait_times
WHERE first_leased_at IS NULL AND state IN ('pending', 'retry_wait')
ORDER BY created_at
LIMIT 20;

-- name: attempt_durations_per_plugin
-- How long attempts run, per plugin and outcome.
SELECT task_type, status, count(*) AS attempts,
       round(avg(run_seconds)::numeric, 3) AS avg_run_s,
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY run_seconds)::numeric, 3) AS p95_run_s
FROM attempt_durations
WHERE finished_at IS NOT NULL
GROUP BY task_type, status
ORDER BY task_type, status;

-- name: failure_reasons_per_plugin
-- Why attempts fail, per plugin, and how many of them were retried.
SELECT task_type, reason, count(*) AS attempts, count(*) FILTER (WHERE retried) AS retried
FROM attempt_failures
GROUP BY task_type, reason
ORDER BY attempts DESC;

-- name: failure_reasons_per_worker
-- Why attempts fail, per worker.
SELECT worker_name, worker_id, reason, count(*) AS attempts
FROM attempt_failures
GROUP BY worker_name, worker_id, reason
ORDER BY attempts DESC;

-- name: reliability_per_plugin
-- Attempts, retries and outcomes per plugin, worst first.
SELECT * FROM task_type_reliability ORDER BY attempt_failure_rate DESC NULLS LAST;

-- name: reliability_per_worker
-- The same per worker.
SELECT * FROM worker_reliability ORDER BY attempt_failure_rate DESC NULLS LAST, attempts DESC;

-- name: worker_utilisation_last_day
-- Live leases against capacity, per worker and hour (last 24 hours of data).
SELECT worker_name, hour, capacity, avg_live_leases, utilisation
FROM worker_utilisation_hourly
WHERE hour >= (SELECT max(hour) FROM worker_utilisation_hourly) - interval '24 hours'
ORDER BY hour, worker_name;

-- name: cancellation_latency
-- How fast a cancel takes effect on a running task (p50, p95, worst).
SELECT count(*) AS cancellations,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_seconds)::numeric, 3) AS p50_s,
       round(percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_seconds)::numeric, 3) AS p95_s,
       max(latency_seconds) AS max_s
FROM cancellation_latency
WHERE had_live_attempt;

-- name: cancellation_latency_per_organization
-- Per organisation: how fast a cancel reaches the worker, and how fast the worker then stops.
SELECT o.name, coalesce(c.cancellations, 0) AS cancellations, coalesce(c.delivered, 0) AS delivered,
       coalesce(c.acknowledged, 0) AS acknowledged, coalesce(c.terminated, 0) AS terminated,
       round(c.request_to_delivery_p95_seconds::numeric, 3) AS to_delivery_p95_s,
       round(c.delivery_to_ack_p95_seconds::numeric, 3) AS to_ack_p95_s
FROM organizations o
LEFT JOIN cancellation_latency_by_organization c ON c.organization_id = o.id
ORDER BY cancellations DESC, o.name;

-- name: cancellations_never_delivered
-- Cancellations the worker was never told about (ended by the Gateway after the grace period,
-- or still waiting), against those delivered on each channel.
SELECT count(*) AS cancellations,
       count(*) FILTER (WHERE delivery_channel = 'renew') AS on_renew,
       count(*) FILTER (WHERE delivery_channel = 'long-poll') AS on_long_poll,
       count(*) FILTER (WHERE cancel_delivered_at IS NULL) AS never_delivered
FROM cancellation_deliveries;

-- name: throughput_per_hour
-- Tasks created, leased and finished per hour (all plugins), latest first.
SELECT hour, sum(created) AS created, sum(leased) AS leased, sum(completed) AS completed,
       sum(failed_terminal) AS failed_terminal, sum(cancelled) AS cancelled
FROM throughput_hourly
GROUP BY hour
ORDER BY hour DESC
LIMIT 48;

-- name: rejected_writes_per_worker
-- Worker writes the Gateway refused (stale attempts, wrong tokens, cancelled tasks…), per actor.
SELECT actor, data ->> 'command' AS command, data ->> 'reason' AS reason, count(*) AS rejections
FROM analyst_events
WHERE event_type = 'WriteRejected'
GROUP BY actor, command, reason
ORDER BY rejections DESC;
