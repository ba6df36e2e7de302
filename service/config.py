"""One typed settings object for the api, the worker and the CLI (environment prefix ``BAIT_``)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service. Defaults are the embedded mode: SQLite file, in-process runner, CPU."""

    model_config = SettingsConfigDict(env_prefix="BAIT_", env_file=None, extra="ignore")

    database_url: str = Field(
        default="sqlite:///./data/bait.db",
        description="SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user@host/db",
    )
    redis_url: str | None = Field(
        default=None,
        description="redis://host:port/db; when set, jobs go to RQ workers instead of the in-process runner",
    )
    queue_name: str = Field(default="bait", description="RQ queue name")
    host: str = Field(default="127.0.0.1", description="address `bait serve` binds to")
    port: int = Field(default=8000, ge=1, le=65535, description="port `bait serve` listens on")
    device: str = Field(default="auto", description="worker device: auto (CUDA when present), cpu, cuda, cuda:N")
    job_threads: int = Field(
        default=1,
        ge=1,
        le=256,
        description="torch threads for a job's head training, forward passes and validation (the selection keeps "
        "its own): small ops run faster on one thread than on an oversubscribed OpenMP pool",
    )
    warm_up: bool = Field(
        default=True,
        description="a worker (and the in-process runner) trains a tiny head once at start, so the first batch does "
        "not pay torch's start-up (~3 s on a 2-core CPU)",
    )
    max_json_bytes: int = Field(default=64 * 2**20, ge=1024, description="largest JSON request body")
    max_upload_bytes: int = Field(default=2 * 2**30, ge=1024, description="largest bulk upload (.npy/.npz/Parquet)")
    max_upload_inflated_bytes: int = Field(
        default=2 * 2**30,
        ge=1024,
        description="largest size a bulk upload may inflate to (.npz members, Parquet columns): 413 above it, "
        "checked before inflating",
    )
    bulk_block_bytes: int = Field(
        default=32 * 2**20,
        ge=4096,
        description="bulk uploads are read, validated and written this many bytes of rows at a time (the api's "
        "memory per upload is a few times this, whatever the file's size)",
    )
    import_max_files: int = Field(
        default=10_000,
        ge=1,
        description="most Parquet files one import by reference (POST .../items:import) may name, by a glob or a "
        "folder: 400 above it",
    )
    import_max_rows: int = Field(
        default=20_000_000,
        ge=1,
        description="most rows one import by reference may hold, by the files' footers: the job fails above it, "
        "before any row is read",
    )
    import_max_bytes: int = Field(
        default=64 * 2**30,
        ge=1024,
        description="largest size the columns an import reads may inflate to, all files together (declared by the "
        "footers and counted as they decode): the job fails above it",
    )
    max_select_inflated_bytes: int = Field(
        default=2**30,
        ge=1024,
        description="largest size the .npz of a POST /v1/select may inflate to: 413 above it, checked before inflating",
    )
    max_items_per_request: int = Field(default=100_000, ge=1, description="items or labels in one JSON request")
    max_item_data_bytes: int = Field(
        default=64 * 2**10, ge=64, le=16 * 2**20, description="largest `data` object of one item (as compact JSON)"
    )
    reservation_ttl_seconds: int = Field(default=24 * 3600, ge=1, description="how long batch items stay reserved")
    sync_select_max_cells: int = Field(
        default=2_000_000, ge=1, description="POST /v1/select answers synchronously up to n*d*max(k,1) cells"
    )
    sync_select_wait_seconds: float = Field(
        default=30.0, gt=0, description="how long a synchronous /v1/select or predictions request waits for its job"
    )
    job_timeout_seconds: int = Field(default=3600, ge=10, description="RQ job timeout")
    job_max_attempts: int = Field(default=2, ge=1, description="a job whose worker died is re-queued this often")
    job_heartbeat_seconds: float = Field(
        default=3.0, gt=0, description="a running job refreshes its heartbeat this often (from a side thread)"
    )
    job_stale_seconds: float = Field(
        default=15.0,
        gt=0,
        description="a running job whose heartbeat is older than this is taken for dead (at least 2x the heartbeat); "
        "with the sweep interval this bounds recovery: a dead worker's batch is re-queued within stale + sweep",
    )
    sweep_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        description="how often each worker (the api process, with the in-process runner) looks for dead or lost jobs "
        "(re-queues or fails them)",
    )
    print_bootstrap_key: bool = Field(
        default=True, description="embedded mode: mint and print an API key on first start if none exists"
    )
    log_level: str = Field(default="INFO", description="logging level of api and workers")
    secret_key: str | None = Field(
        default=None,
        description="encrypts Label Studio tokens and webhook secrets at rest (any string of 16+ characters); "
        "required with PostgreSQL; embedded mode generates one in a 0600 file next to the SQLite database",
    )
    secret_key_file: Path | None = Field(
        default=None,
        description="when BAIT_SECRET_KEY is unset: a file holding the key, shared by every api and worker process "
        "(generated there, 0600, on first start); docker compose keeps it in a volume",
    )
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, description="outgoing webhook request timeout")
    webhook_max_attempts: int = Field(default=6, ge=1, description="outgoing webhook attempts before giving up")
    webhook_backoff_seconds: float = Field(
        default=5.0, gt=0, description="first retry delay of an outgoing webhook; doubles after each attempt"
    )
    webhook_sweep_seconds: float = Field(
        default=5.0, gt=0, description="how often the api submits the job that retries due webhook deliveries"
    )
    labelstudio_timeout_seconds: float = Field(default=30.0, gt=0, description="HTTP timeout of calls to Label Studio")
    labelstudio_content_ttl_seconds: int = Field(
        default=30 * 86400,
        ge=60,
        description="lifetime of the signed URLs through which Label Studio shows file:// item content",
    )
    labelstudio_reconcile_budget_seconds: float = Field(
        default=60.0, gt=0, description="a batch job reconciles its Label Studio projects for at most this long first"
    )
    public_url: str | None = Field(
        default=None,
        description="this service's URL as Label Studio reaches it; used to show the ML-backend URL of an integration",
    )
    # Data references (issue 6): items given by uri/text are embedded by workers with the pool's encoder.
    data_root: Path | None = Field(
        default=None,
        description="file:// references must lie under this folder (unset: file:// references are refused)",
    )
    tenant_data_roots: dict[str, Path] = Field(
        default_factory=dict,
        description='operator-assigned file:// folders by tenant name, as JSON ({"acme": "/srv/acme"}); '
        "a tenant not named reads <BAIT_DATA_ROOT>/<tenant name>/",
    )
    # Import by reference from an object store (issue 26): the operator assigns each tenant its prefixes and names
    # the endpoint; a request names only s3://bucket/key under one of its prefixes.
    tenant_import_urls: dict[str, list[str]] = Field(
        default_factory=dict,
        description="operator-assigned object-store prefixes a tenant may import from (POST .../items:import), by "
        'tenant name, as JSON ({"acme": ["s3://bucket/acme/"]}); a tenant not named cannot import from an object '
        "store; credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...)",
    )
    import_s3_endpoint: str | None = Field(
        default=None,
        description="the S3 endpoint that s3:// imports read, e.g. http://10.0.0.7:9000 (MinIO, Ceph); unset: AWS "
        "S3 itself; its host must pass the outbound guard (BAIT_OUTBOUND_ALLOW for a private address)",
    )
    import_s3_region: str | None = Field(default=None, description="the S3 region of s3:// imports, e.g. us-east-1")
    outbound_allow: str = Field(
        default="",
        description="hosts, IP addresses or CIDRs (comma-separated) that references, webhooks and Label Studio may "
        "reach although they are loopback/private/link-local, e.g. 127.0.0.1,labelstudio.internal",
    )
    outbound_max_response_bytes: int = Field(
        default=32 * 2**20, ge=1024, description="largest answer read from Label Studio or a webhook receiver"
    )
    allow_private_urls: bool = Field(
        default=False,
        description="deprecated: let every outbound request reach any address (use BAIT_OUTBOUND_ALLOW instead)",
    )
    metrics_token: str | None = Field(
        default=None, description="when set, GET /metrics needs `Authorization: Bearer <token>` (401 otherwise)"
    )
    max_download_bytes: int = Field(default=50 * 2**20, ge=1, description="largest http(s):// reference downloaded")
    download_timeout_seconds: float = Field(default=20.0, gt=0, description="time limit of one http(s) download")
    encode_batch_size: int = Field(default=64, ge=1, le=65536, description="inputs per encoder forward pass")
    max_encoder_bytes: int = Field(
        default=100 * 2**20, ge=1024, description="largest TorchScript encoder upload (stored in the database)"
    )

    # Dashboard sessions and Label Studio hints (issue 24).
    session_idle_seconds: int = Field(
        default=2 * 3600, ge=60, description="a dashboard session ends after this long without a request"
    )
    session_max_seconds: int = Field(
        default=12 * 3600, ge=60, description="a dashboard session ends this long after sign-in, however active"
    )
    labelstudio_hint_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        description="least time between two reconciles that unauthenticated Label Studio events may start "
        "(per integration; events in between are refused and counted)",
    )
    # Key scopes and rate limits (issue 10).
    rate_limit: str = Field(
        default="600/minute",
        description="requests per API key (moving window; `limits` syntax, e.g. 600/minute, 20/second; off: none)",
    )
    rate_limit_expensive: str = Field(
        default="60/minute",
        description="requests per API key to expensive routes (uploads, batch requests, /v1/select, predictions, "
        "embed jobs, encoder uploads), counted on top of BAIT_RATE_LIMIT; off: none",
    )
    # Uploaded TorchScript encoders (issue 10): checked in a child process at upload, run in child processes.
    encoder_timeout_seconds: float = Field(
        default=300.0, gt=0, description="wall-clock limit of one encoder forward pass (its child process is killed)"
    )
    encoder_memory_bytes: int = Field(
        default=8 * 2**30,
        ge=256 * 2**20,
        description=(
            "address-space limit (RLIMIT_AS, on top of torch itself) of the child process that runs an "
            "uploaded encoder on CPU"
        ),
    )
    encoder_check_timeout_seconds: float = Field(
        default=120.0, gt=0, description="time limit of the operator check of an uploaded TorchScript encoder"
    )

    # Worker pool cache (issue 15): a pool's ids and embeddings in memory-mapped files, keyed by its content version.
    worker_cache_dir: Path | None = Field(
        default=Path("data/worker-cache"),
        description="folder of the workers' pool cache (shared by the worker processes of a host; relative paths "
        "from the folder the worker starts in); empty: no cache, every batch reads its pool from the database",
    )
    worker_cache_max_gb: float = Field(
        default=20.0,
        ge=0,
        description="largest size of the worker pool cache in GiB (least recently used pools are removed; "
        "a pool larger than this is read uncached); 0: no cache",
    )

    # Distributed selection (issue 26): a Dask cluster reads the pool store's Parquet shards. Operator config only:
    # no API field reaches these (a Dask scheduler runs whatever code its clients send).
    dask_scheduler: str | None = Field(
        default=None,
        description="address of a Dask scheduler, e.g. tcp://127.0.0.1:8786 (tls:// with BAIT_DASK_TLS_*); when set, "
        "batches of random, margin, confidence, entropy and bait run their pool-wide passes on that cluster "
        "(docs/distributed.md); unset: every batch runs in the worker's own process, as before",
    )
    dask_connect_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="how long a batch waits to reach the Dask scheduler before it fails with engine_unavailable",
    )
    dask_fallback_local: bool = Field(
        default=False,
        description="when the Dask scheduler cannot be reached, run the batch in the worker's own process instead of "
        "failing it with engine_unavailable",
    )
    # Mutual TLS with the scheduler (distributed's Security): the scheduler and its workers are started with
    # --tls-ca-file/--tls-cert/--tls-key of the same CA, the address is tls://..., and these three name our side.
    dask_tls_ca_file: Path | None = Field(
        default=None,
        description="CA certificate (PEM) that signed the Dask scheduler's and workers' certificates; with "
        "BAIT_DASK_TLS_CERT and BAIT_DASK_TLS_KEY, required when BAIT_DASK_SCHEDULER is tls://",
    )
    dask_tls_cert: Path | None = Field(
        default=None, description="this service's client certificate (PEM) for the Dask scheduler, signed by that CA"
    )
    dask_tls_key: Path | None = Field(default=None, description="the private key (PEM) of BAIT_DASK_TLS_CERT")
    pool_store: str = Field(
        default="data/pool-store",
        description="the pool store: Parquet shards of every pool's embeddings, versioned by the pool's content "
        "version and written incrementally, read by the Dask workers (a local folder, relative paths from the folder "
        "the process starts in, or file://; or an object store's URL such as s3://bucket/prefix, opened by pyarrow, "
        "or by fsspec when its filesystem is installed, with credentials from the environment, never in the URL; "
        "every Dask worker must reach the same store)",
    )
    local_pool_max_bytes: int = Field(
        default=16 * 2**30,
        ge=0,
        description="largest pool (items x embedding_dim x 4 bytes of float32) one worker process loads to select "
        "from: a batch of a larger pool is refused before 202 unless its strategy runs on the Dask cluster "
        "(BAIT_DASK_SCHEDULER; random, margin, confidence, entropy, bait), and fails with the same message if it "
        "would still run in the worker's process (a cold start); 0: no limit",
    )
    pool_store_shard_rows: int = Field(
        default=65536, ge=1, description="rows per Parquet shard of the pool store (one Dask task per shard)"
    )
    pool_store_on_arrival: str = Field(
        default="auto",
        description="write a pool's new version to the pool store as items arrive (a job after each upload, import, "
        "split move, encoder change or embed job commits; only the new and changed rows are written) instead of at the "
        "pool's next batch on the cluster: auto (on when BAIT_DASK_SCHEDULER is set), true or false",
    )

    @field_validator("dask_scheduler", mode="before")
    @classmethod
    def _empty_scheduler_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("dask_scheduler")
    @classmethod
    def _check_scheduler(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(tcp|tls|inproc|ucx)://\S+", v):
            raise ValueError("BAIT_DASK_SCHEDULER must be an address such as tcp://127.0.0.1:8786")
        return v

    @field_validator("pool_store")
    @classmethod
    def _check_pool_store(cls, v: str) -> str:
        # A local folder (or file://) is resolved once so every process names the same folder; another scheme is
        # an object store's URL (worker/pool_store.py opens it). Credentials come from the environment: a URL
        # travels in the Dask tasks and shows in the logs.
        if v.startswith("file://") or "://" not in v:
            return str(Path(v.removeprefix("file://")).expanduser().resolve())
        parts = urlsplit(v)
        if not re.fullmatch(r"[a-z][a-z0-9+.-]*", parts.scheme) or not parts.netloc:
            raise ValueError(
                "BAIT_POOL_STORE must be a local folder, a file:// URL or a URL such as s3://bucket/prefix"
            )
        if "@" in parts.netloc:
            raise ValueError(
                "BAIT_POOL_STORE must not carry credentials: give them to every process in its environment "
                "(e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)"
            )
        return v.rstrip("/")

    @field_validator("pool_store_on_arrival", mode="before")
    @classmethod
    def _check_on_arrival(cls, v: object) -> object:
        word = str(v).strip().lower()
        word = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(word, word)
        if word not in ("auto", "true", "false"):
            raise ValueError(f"BAIT_POOL_STORE_ON_ARRIVAL must be auto, true or false, not {v!r}")
        return word

    @field_validator("tenant_import_urls")
    @classmethod
    def _check_tenant_import_urls(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        # Each prefix normalized to s3://bucket/key-prefix/ (a trailing `/`): s3://b/acme admits s3://b/acme/...
        # and never s3://b/acme-evil/.
        from service.urls import split_s3

        out: dict[str, list[str]] = {}
        for tenant, urls in v.items():
            prefixes = []
            for url in urls:
                try:
                    bucket, key = split_s3(url)
                except ValueError as exc:
                    raise ValueError(f"BAIT_TENANT_IMPORT_URLS[{tenant!r}]: {exc}") from None
                if any(c in key for c in "*?["):
                    raise ValueError(f"BAIT_TENANT_IMPORT_URLS[{tenant!r}]: a prefix, not a glob: {url!r}")
                prefixes.append(f"s3://{bucket}/" + (key.rstrip("/") + "/" if key.strip("/") else ""))
            out[tenant] = prefixes
        return out

    @field_validator("import_s3_endpoint", "import_s3_region", mode="before")
    @classmethod
    def _empty_s3_option_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("import_s3_endpoint")
    @classmethod
    def _check_import_s3_endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or "@" in parts.netloc
            or parts.path.strip("/")
            or parts.query
            or parts.fragment
        ):
            raise ValueError(
                "BAIT_IMPORT_S3_ENDPOINT must be http(s)://host[:port] (no path, query or credentials), "
                "e.g. http://10.0.0.7:9000"
            )
        _ = parts.port  # raises ValueError on a bad port
        return f"{parts.scheme}://{parts.netloc}"

    @field_validator("import_s3_region")
    @classmethod
    def _check_import_s3_region(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9-]{1,40}", v):
            raise ValueError("BAIT_IMPORT_S3_REGION must be a region name such as us-east-1")
        return v

    @field_validator("worker_cache_dir", mode="before")
    @classmethod
    def _empty_cache_dir_is_off(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("worker_cache_dir")
    @classmethod
    def _absolute_cache_dir(cls, v: Path | None) -> Path | None:
        # Resolved once, like the SQLite path, so every thread and log line names the same folder.
        return None if v is None else v.expanduser().resolve()

    @field_validator("rate_limit", "rate_limit_expensive")
    @classmethod
    def _check_rate(cls, v: str) -> str:
        from service.ratelimit import parse_rate

        parse_rate(v)  # raises ValueError naming the text
        return v

    @field_validator("secret_key", "secret_key_file", mode="before")
    @classmethod
    def _empty_secret_is_unset(cls, v: object) -> object:
        # docker compose passes an unset variable through as "": treat it as not given.
        return None if v == "" else v

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _empty_token_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("outbound_allow")
    @classmethod
    def _check_outbound_allow(cls, v: str) -> str:
        from service.outbound import OutboundPolicy

        OutboundPolicy.parse(v)  # fails fast on a malformed CIDR
        return v

    @field_validator("database_url")
    @classmethod
    def _check_db_url(cls, v: str) -> str:
        if not (v.startswith("sqlite") or v.startswith("postgresql")):
            raise ValueError("BAIT_DATABASE_URL must be a sqlite:// or postgresql+psycopg:// URL")
        return v

    @field_validator("database_url")
    @classmethod
    def _absolute_sqlite_path(cls, v: str) -> str:
        # Resolved once, against the folder the process starts in, so every part (engine, migrations,
        # the embedded secret key file, the line `bait` prints at start) names the same file.
        if not v.startswith("sqlite") or ":///" not in v:
            return v
        prefix, rest = v.split(":///", 1)
        path, sep, query = rest.partition("?")
        if path in ("", ":memory:") or path.startswith("file:"):
            return v
        return f"{prefix}:///{Path(path).expanduser().resolve()}{sep}{query}"

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if v not in ("auto", "cpu", "cuda") and not v.startswith("cuda:"):
            raise ValueError("BAIT_DEVICE must be auto, cpu, cuda or cuda:N")
        return v

    @field_validator("dask_tls_ca_file", "dask_tls_cert", "dask_tls_key", mode="before")
    @classmethod
    def _empty_tls_path_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    @model_validator(mode="after")
    def _check_dask_tls(self) -> Settings:
        tls = {
            "BAIT_DASK_TLS_CA_FILE": self.dask_tls_ca_file,
            "BAIT_DASK_TLS_CERT": self.dask_tls_cert,
            "BAIT_DASK_TLS_KEY": self.dask_tls_key,
        }
        missing = [name for name, v in tls.items() if v is None]
        scheme = (self.dask_scheduler or "").partition("://")[0]
        if scheme == "tls" and missing:
            raise ValueError(f"BAIT_DASK_SCHEDULER is tls://: set {', '.join(missing)} as well")
        if len(missing) < len(tls):
            if missing:
                raise ValueError(f"Dask TLS needs all three of {', '.join(tls)}; missing {', '.join(missing)}")
            if scheme != "tls":
                raise ValueError("BAIT_DASK_TLS_* are set: BAIT_DASK_SCHEDULER must be a tls:// address")
            unreadable = [f"{name}={v}" for name, v in tls.items() if v is not None and not v.is_file()]
            if unreadable:
                raise ValueError(f"Dask TLS files not found: {', '.join(unreadable)}")
        return self

    @model_validator(mode="after")
    def _check_heartbeat(self) -> Settings:
        if self.job_stale_seconds < 2 * self.job_heartbeat_seconds:
            raise ValueError("BAIT_JOB_STALE_SECONDS must be at least twice BAIT_JOB_HEARTBEAT_SECONDS")
        return self

    @property
    def store_on_arrival(self) -> bool:
        """Whether uploads, imports and embed jobs enqueue a write of the pool store (BAIT_POOL_STORE_ON_ARRIVAL;
        ``auto``: when a Dask scheduler is set, the store's only readers being its workers)."""
        if self.pool_store_on_arrival == "auto":
            return self.dask_scheduler is not None
        return self.pool_store_on_arrival == "true"

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def sqlite_path(self) -> Path | None:
        """The SQLite file (absolute), or None for PostgreSQL and in-memory SQLite."""
        if not self.is_sqlite:
            return None
        path = self.database_url.split(":///", 1)[-1].partition("?")[0]
        return None if path in ("", ":memory:") or path.startswith("file:") else Path(path)

    def database_label(self) -> str:
        """Where the data lives, for messages: the SQLite file, or host/database without credentials."""
        path = self.sqlite_path()
        if path is not None:
            return str(path)
        if self.is_sqlite:
            return "an in-memory SQLite database"
        return self.database_url.split("@")[-1]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


_SAFE_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def tenant_data_root(settings: Any, tenant_name: str) -> Path | None:
    """The folder a tenant's ``file://`` references must lie in, or None (file:// refused for it).

    The operator's assignment (``tenant_data_roots``) wins; otherwise ``<data_root>/<tenant name>``
    when ``data_root`` is set and the name is a plain folder name (letters, digits, ``.``, ``_``, ``-``).
    """
    assigned = (getattr(settings, "tenant_data_roots", None) or {}).get(tenant_name)
    if assigned is not None:
        return Path(assigned)
    root = getattr(settings, "data_root", None)
    if root is None or not _SAFE_FOLDER.fullmatch(tenant_name) or tenant_name in (".", ".."):
        return None
    return Path(root) / tenant_name


def tenant_import_prefixes(settings: Any, tenant_name: str) -> list[str]:
    """The object-store prefixes (``s3://bucket/key-prefix/``) a tenant may import from; empty: none."""
    urls = (getattr(settings, "tenant_import_urls", None) or {}).get(tenant_name, [])
    return [u if u.endswith("/") else f"{u}/" for u in urls]  # normalized by the validator; a model_copy is not
