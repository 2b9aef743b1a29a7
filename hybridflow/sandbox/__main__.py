"""``hybridflow sandbox`` (= ``python -m hybridflow.sandbox``): the sandbox as a local HTTP service.

    hybridflow sandbox                                   # 127.0.0.1:8080, bubblewrap required
    hybridflow sandbox --port 8080 --max-concurrent 8 --memory-limit-mb 2048
    hybridflow sandbox --allow-weak-isolation            # process limits only (no bubblewrap here)

Speaks Sandbox Fusion's ``/run_code`` (docs/sandbox.md), so verl's
``reward_model.sandbox_fusion.url=http://127.0.0.1:8080/run_code`` works against it.
"""

from __future__ import annotations

import argparse
import sys

from hybridflow.sandbox.isolation import IsolationError, require_isolation
from hybridflow.sandbox.limits import SandboxLimits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument("--max-concurrent", type=int, default=4, help="programs running at once (default 4)")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="largest run_timeout, and the default (10)")
    parser.add_argument("--memory-limit-mb", type=int, default=1024, help="largest memory_limit_MB, and the default")
    parser.add_argument("--max-processes", type=int, default=32, help="processes one program may start (default 32)")
    parser.add_argument("--max-output-bytes", type=int, default=1 << 20, help="stdout / stderr cap each (default 1 MiB)")
    parser.add_argument("--allow-weak-isolation", action="store_true",
                        help="serve even without bubblewrap (process limits only: not safe for hostile code)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        limits = SandboxLimits(wall_s=args.timeout_s, memory_mb=args.memory_limit_mb,
                               max_processes=args.max_processes, max_output_bytes=args.max_output_bytes)
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
    uvicorn.run(create_app(limits, isolation, args.max_concurrent), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
