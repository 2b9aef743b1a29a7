"""``hybridflow sandbox`` (= ``python -m hybridflow.entrypoints.sandbox``): the sandbox as a local HTTP service.

    hybridflow sandbox                                   # 127.0.0.1:8080, bubblewrap required
    hybridflow sandbox --port 8080 --max-concurrent 8 --memory-limit-mb 2048
    hybridflow sandbox --allow-weak-isolation            # process limits only (no bubblewrap here)

Speaks Sandbox Fusion's ``/run_code`` (docs/sandbox.md), so a trainer pointed at it works:
hybridflow's ``reward_model.sandbox_fusion.url=http://127.0.0.1:8080/run_code``, or verl main's
homes of that key, ``reward.sandbox_fusion.url`` and the root ``sandbox_fusion.url`` (both read as
the first).
``/run_code`` needs ``Authorization: Bearer TOKEN``: ``--token`` (or ``HYBRIDFLOW_SANDBOX_TOKEN``,
which keeps it out of the process list), else a token generated and printed at start.
``--no-token`` turns that off, on a loopback address only.
"""

from __future__ import annotations

import argparse
import os
import sys

from hybridflow.sandbox.access import TOKEN_ENV, resolve_token
from hybridflow.sandbox.isolation import IsolationError, require_isolation
from hybridflow.sandbox.limits import SandboxLimits
from hybridflow.utils.http_guard import parse_allowed_hosts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridflow sandbox", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument("--max-concurrent", type=int, default=4, help="programs running at once (default 4)")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="largest run_timeout, and the default (10)")
    parser.add_argument("--memory-limit-mb", type=int, default=1024, help="largest memory_limit_MB, and the default")
    parser.add_argument("--max-processes", type=int, default=32, help="processes one program may start (default 32)")
    parser.add_argument(
        "--max-output-bytes", type=int, default=1 << 20, help="stdout / stderr cap each (default 1 MiB)"
    )
    parser.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="serve even without bubblewrap (process limits only: not safe for hostile code)",
    )
    access = parser.add_argument_group("access")
    access.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"bearer token /run_code needs (default: ${TOKEN_ENV}, else one generated and printed)",
    )
    access.add_argument(
        "--no-token", action="store_true", help="let any local client run code without a token (loopback --host only)"
    )
    access.add_argument(
        "--allowed-hosts",
        default=None,
        help="comma-separated Host header names to answer, * = any (default: the --host address; "
        "for 127.0.0.1 also localhost)",
    )
    access.add_argument(
        "--max-body-mb", type=float, default=16.0, help="size of a request body in MiB (default 16; 413 above it)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if not args.max_body_mb > 0:
            raise ValueError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
        token, generated = resolve_token(args.host, args.token, args.no_token)
        allowed_hosts = parse_allowed_hosts(args.allowed_hosts, args.host)
        limits = SandboxLimits(
            wall_s=args.timeout_s,
            memory_mb=args.memory_limit_mb,
            max_processes=args.max_processes,
            max_output_bytes=args.max_output_bytes,
        )
        isolation = require_isolation(args.allow_weak_isolation, "hybridflow sandbox")
    except (ValueError, IsolationError) as exc:
        print(f"hybridflow sandbox: error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from hybridflow.sandbox.executor import describe_limits
    from hybridflow.sandbox.service import create_app

    print(isolation.line(), flush=True)
    print(f"limits per program: {describe_limits(limits)}; {args.max_concurrent} at once", flush=True)
    print(f"Sandbox Fusion endpoint: http://{args.host}:{args.port}/run_code", flush=True)
    if generated:
        print(
            f"sandbox token (/run_code needs 'Authorization: Bearer TOKEN'; set {TOKEN_ENV} to choose it): {token}",
            flush=True,
        )
    elif token is None:
        print("sandbox token: none (--no-token): any process on this machine can run code here", flush=True)
    app = create_app(
        limits,
        isolation,
        args.max_concurrent,
        token=token,
        allowed_hosts=allowed_hosts,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
