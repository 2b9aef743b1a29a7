"""``hybridflow view RUN_DIR [RUN_DIR ...]``: a local web page of runs' curves, rollouts and timings.

Serves on 127.0.0.1 and a free port (printed) unless ``--host``/``--port`` say otherwise; the page
polls for new steps, so it follows a run while it trains. ``--export report.html`` writes the page
as one self-contained file instead. Needs the ``view`` extra (plotly, FastAPI, uvicorn).
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys

from hybridflow.utils.errors import InputError, run_main
from hybridflow.utils.http_guard import is_loopback

NEEDS = ("plotly", "fastapi", "uvicorn")
INSTALL = 'pip install "hybridflow[view]"'


def missing_packages() -> list[str]:
    """The view extra's packages that are not installed."""
    return [name for name in NEEDS if importlib.util.find_spec(name) is None]


def free_port(host: str) -> int:
    """A port nothing listens on now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hybridflow view", description=__doc__)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders (each with metrics.jsonl)")
    parser.add_argument(
        "--dump",
        action="append",
        default=[],
        metavar="DIR",
        help="a rollout/validation dump folder outside the first run folder (repeatable)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--export", default=None, metavar="FILE", help="write one self-contained HTML file and exit")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    missing = missing_packages()
    if missing:
        raise InputError(f"hybridflow view needs {', '.join(missing)}: {INSTALL}")
    from hybridflow.view.run_reader import open_run

    try:
        runs = [open_run(path, args.dump if i == 0 else None) for i, path in enumerate(args.run_dirs)]
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if args.export:
        from hybridflow.view.export import export_report

        print(f"wrote {export_report(runs, args.export)}")
        return
    serve(runs, args.host, args.port)


def serve(runs: list, host: str, port: int) -> None:
    import uvicorn

    from hybridflow.view.app import create_app

    if not is_loopback(host):
        print(
            f"warning: --host {host} is not a loopback address: anyone who can reach it can read these runs",
            file=sys.stderr,
        )
    port = port or free_port(host)
    shown = f"[{host}]" if ":" in host else host
    print(f"hybridflow view: http://{shown}:{port}/  ({len(runs)} run(s); Ctrl-C stops)", flush=True)
    uvicorn.run(create_app(runs, host), host=host, port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("hybridflow view", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
