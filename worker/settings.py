"""Worker agent settings: command-line flags, then ``LEASEHOLD_WORKER_*`` environment variables,
then a TOML config file, then the defaults (first found wins).

A config file holds the same names as the fields below, at top level::

    gateway = "https://gateway.example:8443"
    cert = "/etc/leasehold/worker.pem"
    key = "/etc/leasehold/worker-key.pem"
    ca = "/etc/leasehold/ca.pem"
    max_concurrency = 8
    capabilities = ["tcp-connect", "http-probe"]

In the environment, lists are JSON: ``LEASEHOLD_WORKER_CAPABILITIES='["tcp-connect"]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ENV_PREFIX = "LEASEHOLD_WORKER_"


class WorkerSettings(BaseSettings):
    """Everything the worker agent reads. Environment variables are ``LEASEHOLD_WORKER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    gateway: str = Field(description="base URL of the Gateway's worker API, https://host:port")
    cert: Path = Field(description="this worker's client certificate (PEM); it is the worker's identity")
    key: Path = Field(description="the private key of --cert (PEM)")
    ca: Path = Field(description="CA certificate that signed the Gateway's certificate (PEM)")
    server_name: str | None = Field(
        None, description="host name to verify in the Gateway's certificate (and send as SNI) when it "
                          "differs from the URL's host, e.g. when connecting by IP address")
    max_concurrency: int = Field(4, ge=1, le=256, description="tasks run at once")
    plugins_dir: Path | None = Field(
        None, description="directory of plugin executables named after task types; a task type with no "
                          "file there runs the built-in plugin")
    capabilities: list[str] = Field(
        default_factory=list,
        description="task types this worker runs (repeat the flag); default: every built-in plugin and "
                    "every executable in --plugins-dir. A lease for another type is failed (retryable)")
    wait_seconds: int = Field(20, ge=1, le=30, description="long-poll time of one acquire request")
    acquire_many: bool = Field(
        True, description="ask for as many tasks as there are free slots in one acquire, and carry the next "
                          "acquire on each completion or failure (false: one task per acquire request)")
    batch_records: int = Field(200, ge=1, le=100_000, description="send a result batch every N records")
    batch_seconds: float = Field(2.0, gt=0, le=300, description="...or when its oldest record is T seconds old")
    batch_bytes: int = Field(1024 * 1024, ge=1024, le=3 * 1024 * 1024,
                             description="...or when it holds this many bytes of records")
    max_record_bytes: int = Field(1024 * 1024, ge=1024, le=3 * 1024 * 1024,
                                  description="longest accepted plugin output line; longer is invalid output")
    kill_grace_seconds: float = Field(5.0, gt=0, le=300,
                                      description="wait between SIGTERM and SIGKILL when stopping a plugin")
    shutdown_grace_seconds: float = Field(
        30.0, ge=0, le=86_400,
        description="on SIGTERM/SIGINT, how long running plugins may still finish before they are stopped")
    request_timeout_seconds: float = Field(30.0, gt=0, le=600,
                                           description="time limit of one HTTP request (acquire: plus its wait)")
    backoff_initial_seconds: float = Field(0.5, gt=0, le=60, description="first retry delay when the Gateway "
                                                                         "is unreachable (doubles, full jitter)")
    backoff_max_seconds: float = Field(30.0, gt=0, le=3600, description="longest retry delay")
    health_port: int | None = Field(None, ge=0, le=65535,
                                    description="local port (127.0.0.1, plain HTTP) serving /healthz and /metrics "
                                                "of this agent; off unless set")
    log_format: Literal["text", "json"] = Field(
        "text", description="text: human-readable (a live status table when stderr is a terminal); "
                            "json: one JSON object per line")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR")

    @field_validator("gateway")
    @classmethod
    def _https_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("the Gateway URL must be https://host[:port]")
        return value.rstrip("/")

    @field_validator("capabilities")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(v.strip() for v in value if v.strip()))

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("log level must be DEBUG, INFO, WARNING or ERROR")
        return level

    @model_validator(mode="after")
    def _backoff_order(self) -> WorkerSettings:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoff_max_seconds must not be smaller than backoff_initial_seconds")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) > environment > config file. ``toml_file`` is only set by :meth:`load`.
        toml_file = settings_cls.model_config.get("toml_file")
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if toml_file is not None:
            sources += (TomlConfigSettingsSource(settings_cls, toml_file=toml_file),)
        return sources

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: object) -> WorkerSettings:
        """Settings from ``overrides`` (flags), the environment and ``config_file`` (TOML)."""
        if config_file is None:
            return cls(**overrides)  # type: ignore[arg-type]
        if not config_file.is_file():
            raise ValueError(f"config file {config_file} does not exist")

        class FromFile(cls):  # type: ignore[valid-type,misc]
            model_config = SettingsConfigDict(toml_file=config_file)

        loaded = FromFile(**overrides)
        return cls.model_construct(**{name: getattr(loaded, name) for name in cls.model_fields})

    def check_files(self) -> None:
        """Raise ``ValueError`` naming the first TLS file or directory that is missing."""
        for label, path in (("--cert", self.cert), ("--key", self.key), ("--ca", self.ca)):
            if not path.is_file():
                raise ValueError(f"{label} {path} is not a readable file")
        if self.plugins_dir is not None and not self.plugins_dir.is_dir():
            raise ValueError(f"--plugins-dir {self.plugins_dir} is not a directory")
