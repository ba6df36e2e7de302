"""The `bait` command line: serve, worker, migrate, keys create|list|revoke."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from service.config import Settings, get_settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.domain import keys as keys_domain
from service.migrate import upgrade


def _cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    if settings.is_sqlite and (path := settings.sqlite_path()) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    upgrade(settings.database_url)
    print(f"database at the newest schema: {settings.database_url.split('@')[-1]}")
    return 0


def _cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from service.logredact import install_access_log_redaction
    from service.main import create_app

    if args.migrate:
        _cmd_migrate(settings, args)
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
    # The worker process is where the numerics live; the web process never imports them.
    worker_main = importlib.import_module("worker.rq_worker")
    result: int = worker_main.run(settings, burst=args.burst, name=args.name)
    return result


def _cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    factory = make_sessionmaker(make_engine(settings))
    with session_scope(factory) as session:
        if args.keys_cmd == "create":
            key, info = keys_domain.create_key(session, args.tenant, name=args.name)
            print(f"created key {info.id} ({info.prefix}...) for tenant {info.tenant!r}; it is shown only once:")
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
    k = sub.add_parser("keys", help="manage API keys")
    ksub = k.add_subparsers(dest="keys_cmd", required=True)
    kc = ksub.add_parser("create", help="mint a key for a tenant (created if new); prints the key last")
    kc.add_argument("--tenant", required=True)
    kc.add_argument("--name", default=None)
    kl = ksub.add_parser("list", help="list keys (never the keys themselves)")
    kl.add_argument("--tenant", default=None)
    kr = ksub.add_parser("revoke", help="revoke a key by id or prefix")
    kr.add_argument("key")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"serve": _cmd_serve, "worker": _cmd_worker, "migrate": _cmd_migrate, "keys": _cmd_keys}
    try:
        return handlers[args.cmd](settings, args)
    except Exception as exc:  # a CLI prints one clear line, not a traceback, for expected failures
        from service.errors import ServiceError
        from service.migrate import SchemaOutdated

        if isinstance(exc, ServiceError | SchemaOutdated | ValueError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    raise SystemExit(main())
