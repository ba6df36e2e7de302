"""The `bait` command line: serve, worker, migrate, keys create|list|revoke, pools migrate-store, demo.

It composes the web process (:mod:`service`) and the worker process (:mod:`worker`), so it stands above
both (``bait/``; an import-linter layers contract keeps it there): `bait serve` never imports the
worker's numerics, `bait worker` imports them when it starts.

Every command names the database it uses (on stderr) and, on a missing or outdated schema, prints one
line saying what to run and exits with status 2. In embedded mode (SQLite) `bait serve` migrates by
itself; with PostgreSQL the schema changes only through `bait migrate` (or `bait serve --migrate`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from service.config import Settings, get_settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.domain import keys as keys_domain
from service.logredact import install_log_redaction
from service.migrate import SchemaOutdated, schema_problem, upgrade
from service.scopes import ALL_SCOPES, DEFAULT_CLI_SCOPES, parse_scopes


class CommandError(RuntimeError):
    """An expected failure of a command: its message is printed as one line, the exit status is 2."""


def _announce(settings: Settings) -> None:
    """The database every command is about to use, on stderr (stdout stays for what scripts read)."""
    kind = "SQLite" if settings.is_sqlite else "PostgreSQL"
    print(f"database: {settings.database_label()} ({kind})", file=sys.stderr, flush=True)


def _require_sqlite_file(settings: Settings) -> None:
    """Refuse to work on a SQLite file that does not exist (connecting would create an empty one)."""
    path = settings.sqlite_path()
    if path is not None and not path.exists():
        raise CommandError(
            f"no database at {path}: start the service once (`bait serve`) or run `bait migrate` there, "
            "or point BAIT_DATABASE_URL at your database"
        )


def _require_schema(settings: Settings) -> None:
    """One line saying what to run when the schema is missing or not the newest."""
    _require_sqlite_file(settings)
    engine = make_engine(settings)
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)  # its "Context impl ..." lines would bury the one that matters
    try:
        problem = schema_problem(engine, settings.database_url, settings.database_label())
    finally:
        alembic_log.setLevel(level)
        engine.dispose()
    if problem is not None:
        raise SchemaOutdated(problem)


def _cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    if (path := settings.sqlite_path()) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    upgrade(settings.database_url)
    print(f"database at the newest schema: {settings.database_label()}")
    return 0


def _cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from service.logredact import install_access_log_redaction
    from service.main import create_app

    _announce(settings)
    if args.migrate or settings.is_sqlite:  # embedded mode keeps its own schema up to date
        _cmd_migrate(settings, args)
    else:
        _require_schema(settings)
    if settings.print_bootstrap_key:
        factory = make_sessionmaker(make_engine(settings))
        with session_scope(factory) as session:
            if keys_domain.count_active_keys(session) == 0:
                key, _ = keys_domain.create_key(session, "default", name="bootstrap")
                print("No API key existed: created one for tenant 'default'. It is shown only now:", flush=True)
                print(key, flush=True)
    app = create_app(settings)
    config = uvicorn.Config(app, host=args.host or settings.host, port=args.port or settings.port, log_level="info")
    install_access_log_redaction()  # after uvicorn configured its loggers: no secret in the access log
    uvicorn.Server(config).run()
    return 0


def _cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.redis_url:
        raise CommandError("`bait worker` needs BAIT_REDIS_URL (without it `bait serve` runs jobs in-process)")
    _announce(settings)
    _require_schema(settings)
    # Imported here, not at the top: the worker process is where the numerics (torch) load; `bait serve`,
    # `bait migrate` and `bait keys` never import them. A plain import, so the import contracts see it.
    from worker import rq_worker

    return rq_worker.run(settings, burst=args.burst, name=args.name)


def _cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    _announce(settings)
    _require_schema(settings)
    factory = make_sessionmaker(make_engine(settings))
    with session_scope(factory) as session:
        if args.keys_cmd == "create":
            scopes = parse_scopes(args.scope)
            key, info = keys_domain.create_key(session, args.tenant, name=args.name, scopes=scopes)
            print(
                f"created key {info.id} ({info.prefix}...) for tenant {info.tenant!r} "
                f"with scopes {','.join(info.scopes)}; it is shown only once:"
            )
            print(key)
        elif args.keys_cmd == "list":
            rows = keys_domain.list_keys(session, args.tenant)
            print(f"{'id':32}  {'prefix':12}  {'tenant':20}  {'name':16}  created                    revoked")
            for r in rows:
                print(
                    f"{r.id:32}  {r.prefix:12}  {r.tenant:20}  {(r.name or ''):16}  "
                    f"{r.created_at.isoformat():26} {r.revoked_at.isoformat() if r.revoked_at else '-'}"
                )
        elif args.keys_cmd == "revoke":
            info = keys_domain.revoke_key(session, args.key)
            print(f"revoked key {info.id} ({info.prefix}...) of tenant {info.tenant!r}")
    return 0


def _cmd_pools(settings: Settings, args: argparse.Namespace) -> int:
    _announce(settings)
    _require_schema(settings)
    # `migrate-store` reads pools with the worker's reader and writes Parquet: the worker's code, imported only
    # here (like `bait worker`), with a plain import so the import contracts see it.
    from worker import pool_store

    try:
        lines = pool_store.migrate_all(settings, args.pool or None, progress_bars=not args.quiet)
    except LookupError as exc:
        raise CommandError(str(exc)) from None
    for line in lines:
        print(line)
    where = pool_store.display(pool_store.store_root(settings))
    print(f"pool store {where}: {len(lines)} pool(s) at their current version")
    return 0


def _cmd_demo(_settings: Settings, args: argparse.Namespace) -> int:
    from service import demo  # httpx + numpy + scikit-learn's bundled data, imported only here

    logging.getLogger("httpx").setLevel(logging.WARNING)  # the demo prints what it does itself
    return demo.run(url=args.url, key=args.key, rounds=args.rounds, batch_size=args.batch_size, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bait", description="bait-service: which items to label next")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the HTTP api (embedded job runner unless BAIT_REDIS_URL is set)")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--migrate", action="store_true", help="apply migrations before starting")
    w = sub.add_parser("worker", help="run an RQ worker (needs BAIT_REDIS_URL)")
    w.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    w.add_argument("--name", default=None)
    sub.add_parser("migrate", help="upgrade the database schema to the newest migration")
    d = sub.add_parser("demo", help="the whole loop against a running service, on scikit-learn's digits")
    d.add_argument("--url", default="http://127.0.0.1:8000", help="the service (default: %(default)s)")
    d.add_argument("--key", default=None, help="an API key (default: $BAIT_API_KEY)")
    d.add_argument("--rounds", type=int, default=3, help="batches to request and label (default: %(default)s)")
    d.add_argument("--batch-size", type=int, default=20, help="items per batch (default: %(default)s)")
    d.add_argument("--seed", type=int, default=0, help="seed of the data split and the batches (default: 0)")
    pl = sub.add_parser("pools", help="operator commands on pools")
    plsub = pl.add_subparsers(dest="pools_cmd", required=True)
    pm = plsub.add_parser(
        "migrate-store",
        help="write every pool's embeddings to the pool store (BAIT_POOL_STORE) at its current version, "
        "for distributed selection (docs/distributed.md)",
    )
    pm.add_argument("--pool", action="append", default=[], help="only this pool id (repeatable)")
    pm.add_argument("--quiet", action="store_true", help="no progress bars")
    k = sub.add_parser("keys", help="manage API keys")
    ksub = k.add_subparsers(dest="keys_cmd", required=True)
    kc = ksub.add_parser("create", help="mint a key for a tenant (created if new); prints the key last")
    kc.add_argument("--tenant", required=True)
    kc.add_argument("--name", default=None)
    kc.add_argument(
        "--scope",
        default=",".join(DEFAULT_CLI_SCOPES),
        help=f"comma-separated scopes of {','.join(ALL_SCOPES)} (default: {','.join(DEFAULT_CLI_SCOPES)}; "
        "admin uploads encoders and configures webhooks and integrations)",
    )
    kl = ksub.add_parser("list", help="list keys (never the keys themselves)")
    kl.add_argument("--tenant", default=None)
    kr = ksub.add_parser("revoke", help="revoke a key by id or prefix")
    kr.add_argument("key")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = get_settings()
    except ValidationError as exc:  # a bad BAIT_* variable: name it and say why, on one line
        problems = "; ".join(
            (f"BAIT_{'_'.join(map(str, e['loc'])).upper()}: " if e["loc"] else "") + e["msg"] for e in exc.errors()
        )
        print(f"error: invalid configuration: {problems}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no URL credentials in any log line, whichever library writes it
    handlers = {
        "serve": _cmd_serve,
        "worker": _cmd_worker,
        "migrate": _cmd_migrate,
        "keys": _cmd_keys,
        "pools": _cmd_pools,
        "demo": _cmd_demo,
    }
    try:
        return handlers[args.cmd](settings, args)
    except Exception as exc:  # a CLI prints one clear line, not a traceback, for expected failures
        from sqlalchemy.exc import OperationalError

        from service.crypto import SecretKeyError
        from service.errors import ServiceError

        if isinstance(exc, OperationalError):
            reason = str(exc.orig or exc).strip().splitlines()[0]
            print(f"error: cannot use the database at {settings.database_label()}: {reason}", file=sys.stderr)
            return 2
        if isinstance(exc, CommandError | ServiceError | SchemaOutdated | SecretKeyError | ValueError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    raise SystemExit(main())
