"""Gateway settings, from the environment (``LEASEHOLD_*``) or ``leasehold gateway serve`` flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: A PostgreSQL interval the partition settings accept: a count and a unit.
_INTERVAL = r"^[1-9][0-9]* (hour|day|week|month|year)s?$"


class GatewaySettings(BaseSettings):
    """Every setting the Gateway reads. Environment variables are ``LEASEHOLD_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="LEASEHOLD_", extra="ignore", populate_by_name=True)

    database_url: str | None = Field(
        None, validation_alias=AliasChoices("database_url", "LEASEHOLD_DATABASE_URL", "DATABASE_URL"),
        description="PostgreSQL URL, postgresql://USER@HOST:PORT/DB (also read from DATABASE_URL); required")
    read_database_url: str | None = Field(
        None, description="PostgreSQL URL of a streaming replica for the operator reads that tolerate lag (GET of "
                          "lists, details, counts, findings, events; the console's pages); not set: the primary")
    notify_database_url: str | None = Field(
        None, description="PostgreSQL URL for the LISTEN connection of wake-ups; behind a transaction-pooling proxy "
                          "point it at the server itself (not set: the database URL)")
    prepared_statements: bool = Field(
        True, description="let the database driver prepare frequent statements on the server; turn off behind a "
                          "transaction-pooling proxy that does not track them (PgBouncer before 1.21)")
    host: str = Field("127.0.0.1", description="address to listen on")
    worker_port: int = Field(8443, ge=0, le=65535, description="HTTPS port of the worker API (mTLS required)")
    operator_port: int = Field(8444, ge=0, le=65535,
                               description="HTTPS port of the operator API (bearer API keys; no client certificate)")
    health_port: int | None = Field(
        None, ge=0, le=65535, description="plain-HTTP port serving only /healthz and /readyz, for load-balancer "
                                          "probes that cannot present a client certificate (off unless set)")
    pki_dir: Path | None = Field(None, description="directory made by `leasehold pki init` (ca.pem, server.pem…)")
    ca_file: Path | None = Field(None, description="CA bundle that signs worker certificates (overrides pki_dir)")
    cert_file: Path | None = Field(None, description="server certificate (overrides pki_dir)")
    key_file: Path | None = Field(None, description="server private key (overrides pki_dir)")
    processes: int = Field(1, ge=1, le=64, description="processes serving the same ports (SO_REUSEPORT)")
    pool_size: int = Field(20, ge=2, le=500, description="database connections per process")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="largest accepted request body")
    header_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="the TLS handshake, and then a connection's first request header, must "
                                        "each complete within this; else the connection is closed")
    keepalive_timeout_seconds: float = Field(
        15.0, gt=0, le=3600, description="an idle keep-alive connection is closed after this; the next request's "
                                         "header must be complete within it after the previous answer")
    body_timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="a request body must arrive within this once its header has (else 408)")
    max_connections_per_listener: int = Field(
        1000, ge=1, le=1_000_000, description="open connections per listener and process; at the cap a new "
                                              "connection evicts the oldest one that has not sent a complete "
                                              "request header (none: the new one is refused)")
    max_wait_seconds: int = Field(30, ge=0, le=300, description="longest acquire long-poll")
    poll_interval_seconds: float = Field(1.0, gt=0, le=60,
                                         description="how often a waiting long-poll re-polls while no wake-up "
                                                     "channel is up (LISTEN off or lost, and no Redis hints)")
    wake_sweep_seconds: float = Field(2.0, gt=0, le=600,
                                      description="period of each process's one fallback sweep for its waiting "
                                                  "long-polls: one read-only query for work (and cancels) their "
                                                  "notifications may have missed; bounds a missed wake-up's delay")
    wake_batch: int = Field(4, ge=1, le=10_000,
                            description="most long-polls one notification (or one sweep) wakes at once; each "
                                        "woken poll that leases a task wakes one more")
    bulk_interval_seconds: float = Field(60.0, gt=0, le=3600,
                                         description="how often each process looks for a bulk operation to "
                                                     "carry on while it runs none (one it starts runs at once; "
                                                     "one a stopped process held, once its hold has run out)")
    bulk_hold_seconds: float = Field(60.0, ge=1, le=3600,
                                     description="how long a process holds the bulk operation it is running; "
                                                 "one that stopped without releasing it is carried on by another "
                                                 "process after this")
    bulk_batch: int = Field(200, ge=1, le=10_000,
                            description="tasks a process reaches of one bulk operation before it takes the next "
                                        "(operations run side by side, a batch each in turn)")
    webhook_interval_seconds: float = Field(
        2.0, gt=0, le=600, description="how often each process looks for due webhook deliveries and sends them "
                                       "(one transaction when none is due): the longest a new notification waits "
                                       "before its first send")
    webhook_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="a webhook receiver must answer within this, else the attempt failed")
    webhook_max_attempts: int = Field(
        16, ge=1, le=100, description="sends of one webhook delivery before it becomes a dead letter (an "
                                      "operator can redeliver it)")
    webhook_backoff_base_seconds: float = Field(
        5.0, gt=0, le=3600, description="wait after a delivery's first failed send; doubled after each further "
                                        "one (less a random jitter of up to half), up to webhook_backoff_cap_seconds")
    webhook_backoff_cap_seconds: float = Field(
        3600.0, gt=0, le=86400, description="longest wait between two sends of a webhook delivery")
    listen: bool = Field(True, description="wake long-polls by PostgreSQL LISTEN/NOTIFY; turn off where LISTEN "
                                           "is unavailable (e.g. a transaction-pooling proxy): Redis hints and "
                                           "the poll remain")
    redis_url: str | None = Field(None, description="Redis URL for wake-up hints between Gateway processes "
                                                    "(optional; without it, or while it is down, LISTEN/NOTIFY "
                                                    "and the poll wake workers)")
    metrics_sample_seconds: float = Field(5.0, gt=0, le=600,
                                          description="how often the database gauges of /metrics (queue depth, "
                                                      "oldest pending age, live leases) are sampled")
    sweep_interval_seconds: float = Field(1.0, gt=0, le=600, description="lease sweeper period")
    presence_publish_seconds: float = Field(
        15.0, gt=0, le=600, description="how often each process publishes the workers it saw poll, renew or write "
                                        "since its last publish (one statement for all of them; a process that "
                                        "dies loses at most this much)")
    worker_live_seconds: float = Field(
        75.0, gt=0, le=86400, description="a worker seen (poll, renew or write; a long-poll counts while it "
                                          "waits) within this is `live`; keep it well above "
                                          "presence_publish_seconds, else a polling worker can look idle")
    worker_idle_seconds: float = Field(
        300.0, gt=0, le=31 * 86400, description="a worker seen within this, but not within worker_live_seconds, "
                                                "is `idle`; longer ago, or never: `gone`")
    fair_shares: bool = Field(True, description="serve a shared worker's organisations by fair shares at equal "
                                                "priority; off: the oldest task of any organisation first "
                                                "(per-organisation caps hold either way)")
    checkpoint_interval_seconds: float = Field(
        300.0, ge=0, description="how often to seal the stream heads (replay checkpoint); 0 disables")
    seal_key_file: Path | None = Field(
        None, description="Ed25519 private key (PEM, from `leasehold seal keygen`) that signs the seals; the "
                          "database never sees it. With digest_dir set, signed seals replace plain checkpoints")
    digest_dir: Path | None = Field(
        None, description="digest sink: directory the signed seals are appended to (JSON lines, one file per "
                          "UTC day); put it where the database host cannot rewrite it")
    seal_interval_seconds: float = Field(
        5.0, gt=0, le=3600, description="how often to write and publish a signed seal (with seal_key_file)")
    partition_interval_seconds: float = Field(
        3600.0, ge=0, le=86400, description="how often to create the event log's time partitions ahead of time "
                                            "(also at start); 0 disables")
    partition_span: str = Field("1 month", pattern=_INTERVAL, description="range of each new event log partition")
    partition_ahead: str = Field("2 months", pattern=_INTERVAL,
                                 description="how far ahead of now the event log's partitions must reach")
    schedule_interval_seconds: float = Field(
        1.0, ge=0, le=600, description="how often to start due scheduled scans; 0 disables")
    cancel_grace_seconds: int = Field(30, ge=1, le=3600,
                                      description="how long a cancelling task waits for the worker's ack")
    admin_api_key: str | None = Field(None, description="bootstrap administrator API key (stored hashed); from "
                                                        "LEASEHOLD_ADMIN_API_KEY only, never a flag")
    admin_api_key_file: Path | None = Field(None, description="file holding the bootstrap administrator API key "
                                                              "(instead of LEASEHOLD_ADMIN_API_KEY)")
    rate_limit_per_second: float = Field(200.0, gt=0, description="requests per second per worker certificate")
    rate_limit_burst: int = Field(400, ge=1, description="burst allowance per worker certificate")
    auth_failure_burst: int = Field(
        20, ge=1, description="failed operator authentications (unknown, revoked or expired API keys, at the API "
                              "and the console's sign-in) allowed at once per source address and per key prefix; "
                              "past it, 429 until the budget refills")
    auth_failures_per_minute: float = Field(
        6.0, gt=0, description="how fast the failed-authentication budget of a source address or key prefix "
                               "refills (failures per minute)")
    shutdown_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="on SIGTERM, how long in-flight requests may take to finish before they are "
                                        "cancelled (waiting long-polls are answered at once)")
    log_level: str = Field("INFO", description="log level (JSON logs on stderr)")

    @model_validator(mode="after")
    def _seal_settings_go_together(self) -> GatewaySettings:
        if (self.seal_key_file is None) != (self.digest_dir is None):
            raise ValueError("seal_key_file and digest_dir go together: set both to publish signed seals")
        return self

    @model_validator(mode="after")
    def _idle_outlasts_live(self) -> GatewaySettings:
        if self.worker_idle_seconds < self.worker_live_seconds:
            raise ValueError("worker_idle_seconds must be at least worker_live_seconds")
        return self

    def bootstrap_key(self) -> str | None:
        """The bootstrap administrator key: ``admin_api_key``, else the first line of
        ``admin_api_key_file`` (an unreadable file raises ``OSError``)."""
        if self.admin_api_key:
            return self.admin_api_key
        if self.admin_api_key_file is not None:
            return self.admin_api_key_file.read_text().strip() or None
        return None

    def notify_url(self) -> str:
        """Where the LISTEN connection goes: ``notify_database_url``, else the database URL."""
        return self.notify_database_url or self.resolved_database_url()

    def resolved_database_url(self) -> str:
        """The database to use; the command line resolves "none given" before the Gateway starts."""
        if self.database_url is None:
            raise ValueError("no database URL: set --database-url or LEASEHOLD_DATABASE_URL")
        return self.database_url
