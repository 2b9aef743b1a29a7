"""``hybridflow serve --model PATH`` (= ``python -m hybridflow.entrypoints.serve``): start the HTTP server.

    hybridflow serve --model tiny-llama --port 8000
    hybridflow serve --model smollm2-135m-instruct --dtype bf16 --host 127.0.0.1 --port 8000
    HYBRIDFLOW_API_KEY=secret hybridflow serve --model PATH --host 0.0.0.0 --allowed-hosts gpu7.lan

``--model`` is an HF folder, a known name (``tiny-llama``, ``smollm2-135m-instruct``) or a Hub id
(``org/name[@revision]``, downloaded once into the Hugging Face cache).
The server listens on 127.0.0.1 unless ``--host`` says otherwise and answers only requests
whose Host header names the address it listens on (``--allowed-hosts`` widens that) and that
no foreign web page sent (Origin). With ``--api-key`` (or ``HYBRIDFLOW_API_KEY``) every request
needs ``Authorization: Bearer KEY``; an address other than loopback needs a key.
``/update_weights_from_disk`` is off unless ``--weights-root DIR`` names the folder it may read;
it and the ``--control-routes`` need a control token: ``--control-token`` (or
``HYBRIDFLOW_CONTROL_TOKEN``), the API key, or one generated and printed at start
(``--no-control-token`` turns it off, on a loopback address only).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hybridflow.utils.allocator import keep_freed_memory

if TYPE_CHECKING:
    from hybridflow.server.state import ServerState

API_KEY_ENV = "HYBRIDFLOW_API_KEY"
CONTROL_TOKEN_ENV = "HYBRIDFLOW_CONTROL_TOKEN"
DEFAULT_MAX_REQUEST_TOKENS = 65536
SERVE_EXTRA = ("fastapi", "uvicorn", "jinja2")
INSTALL_SERVE = 'pip install "torch==2.13.0" -e ".[serve]"   (in the hybridflow checkout)'
# oneDNN keeps a compiled kernel per matmul shape in two caches of 1024 entries each (its own
# primitive cache and PyTorch's ideep cache, LRU_CACHE_CAPACITY), 0.6-3 MiB per entry. The
# continuous batcher makes a new shape at almost every join (rows × prompt width), so with
# the default sizes a server's memory grows by hundreds of MiB before the caches are full.
# A shape used once is not worth keeping; the decode shapes (one per batch size) are.
DEFAULT_KERNEL_CACHE = 128
_KERNEL_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return port


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The ``hybridflow serve`` parser (values are checked together in :func:`parse_args`)."""
    parser = argparse.ArgumentParser(
        prog="hybridflow serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_model_arguments(parser)
    _add_access_arguments(parser.add_argument_group("access"))
    _add_limit_arguments(parser.add_argument_group("per-request limits"))
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument(
        "--shutdown-timeout-s",
        type=float,
        default=5.0,
        help="on SIGTERM, wait this long for running requests before failing them (default 5)",
    )
    runtime.add_argument(
        "--kernel-cache",
        type=_positive,
        default=DEFAULT_KERNEL_CACHE,
        help=f"oneDNN kernels kept per cache (default {DEFAULT_KERNEL_CACHE}; an environment "
        f"{_KERNEL_CACHE_ENV[0]} / {_KERNEL_CACHE_ENV[1]} wins)",
    )
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from hybridflow.inference.decoders import DECODERS

    parser.add_argument(
        "--model",
        required=True,
        help="HF model folder, known name (tiny-llama, smollm2-135m-instruct) or Hub id (org/name[@revision])",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="weights and compute dtype; auto (default) = bf16 where the hardware has a native bf16 matmul, else fp32",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto = cuda if available")
    parser.add_argument("--served-model-name", default=None, help="the `model` name clients send (default: --model)")
    parser.add_argument("--decoder", default="auto", choices=list(DECODERS), help="sampler forward: lean, hf or auto")
    parser.add_argument("--max-batch-rows", type=_positive, default=64, help="most sequences decoded in one forward")
    parser.add_argument(
        "--batch-window-ms",
        type=float,
        default=0.0,
        help="an idle server waits this long after a request for more to start together (default 0)",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=_positive,
        default=512,
        help="reply limit when a request gives none (capped by the context)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler for requests without a seed")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--tool-call-parser",
        default="hermes",
        help="format of tool calls in chat replies when a request offers tools (default hermes: "
        "<tool_call>{json}</tool_call>)",
    )
    parser.add_argument("--trust-remote-code", action="store_true", help="allow custom model code in the folder")


def _add_access_arguments(security: argparse._ArgumentGroup) -> None:
    security.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on every request (default: ${API_KEY_ENV})",
    )
    security.add_argument(
        "--allowed-hosts",
        default=None,
        help="comma-separated Host header names to answer, * = any (default: the --host address; "
        "for 127.0.0.1 also localhost)",
    )
    security.add_argument(
        "--weights-root",
        default=None,
        help="folder whose subfolders /update_weights_from_disk may load (default: the route is off)",
    )
    security.add_argument(
        "--control-routes",
        action="store_true",
        help="turn on the trainer's routes: /abort_all, /resume_generation, /sleep, /wake_up, "
        "/update_weights (tensor push), /clear_kv_cache (default: off)",
    )
    security.add_argument(
        "--control-token",
        default=os.environ.get(CONTROL_TOKEN_ENV) or None,
        help="bearer token the control routes and /update_weights_from_disk need (default: "
        f"${CONTROL_TOKEN_ENV}, else the API key, else one generated and printed at start)",
    )
    security.add_argument(
        "--no-control-token",
        action="store_true",
        help="let any local client use the control routes without a token (loopback --host only)",
    )


def _add_limit_arguments(limits: argparse._ArgumentGroup) -> None:
    limits.add_argument("--max-n", type=_positive, default=16, help="responses per prompt (default 16)")
    limits.add_argument("--max-prompts", type=_positive, default=64, help="prompts in one request (default 64)")
    limits.add_argument(
        "--max-stop", type=_positive, default=16, help="stop strings or stop token ids in one request (default 16)"
    )
    limits.add_argument(
        "--max-stop-chars", type=_positive, default=256, help="characters of a stop string (default 256)"
    )
    limits.add_argument(
        "--max-prompt-tokens", type=_positive, default=None, help="tokens of one prompt (default: the model's context)"
    )
    limits.add_argument("--max-body-mb", type=float, default=8.0, help="size of a request body in MiB (default 8)")
    limits.add_argument(
        "--max-weight-bucket-mb",
        type=float,
        default=512.0,
        help="size of one /update_weights bucket in MiB (default 512)",
    )
    limits.add_argument(
        "--max-request-tokens",
        type=_positive,
        default=DEFAULT_MAX_REQUEST_TOKENS,
        help="tokens one request may ask to generate, prompts x n x max_tokens; above it: 429 "
        f"(default {DEFAULT_MAX_REQUEST_TOKENS})",
    )
    limits.add_argument(
        "--max-request-rows",
        type=_positive,
        default=None,
        help="sequences one request may decode at once while others wait (default: half of "
        "--max-batch-rows), so that one big request cannot hold every row",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked: a bad value ends the program with argparse's usage message."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    problem = _settle_args(args)
    if problem is not None:
        parser.error(problem)
    return args


def _settle_args(args: argparse.Namespace) -> str | None:
    """Check the values together and fill in the derived ones; returns the first problem, or None."""
    if args.batch_window_ms < 0:
        return "--batch-window-ms must be >= 0"
    if args.max_n > args.max_batch_rows:
        args.max_n = args.max_batch_rows  # a request's n rows must fit one forward
    if not args.max_body_mb > 0:
        return "--max-body-mb must be > 0"
    if not args.max_weight_bucket_mb > 0:
        return "--max-weight-bucket-mb must be > 0"
    if args.shutdown_timeout_s < 0:
        return "--shutdown-timeout-s must be >= 0"
    if args.weights_root is not None and not Path(args.weights_root).expanduser().is_dir():
        return f"--weights-root {args.weights_root!r} is not a folder"
    if args.max_request_rows is None:
        args.max_request_rows = max(1, args.max_batch_rows // 2)
    args.max_request_rows = min(args.max_request_rows, args.max_batch_rows)
    problem = resolve_tokens(args)
    if problem is not None:
        return problem
    from hybridflow.agent.parsers import TOOL_PARSERS

    if args.tool_call_parser not in TOOL_PARSERS:
        return f"--tool-call-parser {args.tool_call_parser!r} is unknown; choose from {TOOL_PARSERS.names()}"
    return None


def resolve_tokens(args: argparse.Namespace) -> str | None:
    """Settle ``args.control_token`` (and ``args.control_token_generated``); returns why the
    access flags cannot be served as given, or None.

    An address other than loopback must have an API key: anyone who can reach it could
    otherwise generate, and with the control routes replace the weights. The control routes
    and ``/update_weights_from_disk`` need a token even on loopback, where any local process or
    a browser's page can connect; it is the ``--control-token``, else the API key, else a fresh
    one (printed at start). ``--no-control-token`` drops it, on loopback only.
    """
    from hybridflow.server.security import is_loopback, new_token

    args.control_token_generated = False
    if not is_loopback(args.host) and not args.api_key:
        return (
            f"--host {args.host} is reachable from other machines: give --api-key (or ${API_KEY_ENV}) so "
            "that only your clients are served, or listen on 127.0.0.1"
        )
    if args.api_key and args.control_token and args.control_token != args.api_key:
        return (
            "--control-token differs from --api-key, but a request carries one bearer token: with an API key, "
            "the key is the control token too; give only --api-key"
        )
    if args.no_control_token:
        if not is_loopback(args.host):
            return (
                f"--no-control-token is only allowed on a loopback --host (127.0.0.1, ::1, localhost), not {args.host}"
            )
        args.control_token = None
        return None
    if not (args.control_routes or args.weights_root is not None):
        args.control_token = None  # no route needs it
        return None
    if not args.control_token and not args.api_key:
        args.control_token, args.control_token_generated = new_token(), True
    args.control_token = args.control_token or args.api_key
    return None


def missing_serve_extra() -> str | None:
    """Why the ``serve`` extra is unusable (the first import that fails), or ``None``."""
    for name in SERVE_EXTRA:
        try:
            __import__(name)
        except ImportError as err:
            return f"{name} ({err})"
    return None


def check_can_listen(host: str, port: int) -> None:
    """Bind and release ``host:port`` now, so that a taken port or an unknown host is an error
    before the model loads rather than after."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise OSError(f"cannot resolve --host {host!r}: {err.strerror}") from err
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(address)
        except OSError as err:
            raise OSError(f"cannot listen on {host}:{port}: {err.strerror}") from err


def _limit_kernel_caches(size: int) -> None:
    # Read by oneDNN when it first builds a kernel, so this must run before the model loads.
    for name in _KERNEL_CACHE_ENV:
        os.environ.setdefault(name, str(size))


def _eos_ids(tokenizer, model) -> tuple[int, ...]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (an int or a list)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    generation_config = getattr(model, "generation_config", None)
    extra = getattr(generation_config, "eos_token_id", None)
    ids += extra if isinstance(extra, list) else ([extra] if extra is not None else [])
    return tuple(dict.fromkeys(int(i) for i in ids))


def build_state(args: argparse.Namespace) -> ServerState:
    """Load the model and tokenizer (and a vision-language model's processor, which chat
    ``image_url`` parts need) and wire the engine (not started yet)."""
    from hybridflow.agent.parsers import get_tool_parser
    from hybridflow.models.loader import load_vision_processor
    from hybridflow.server.checks import ServerLimits
    from hybridflow.server.security import parse_allowed_hosts
    from hybridflow.server.state import ServerState
    from hybridflow.server.text import TextCodec

    allowed_hosts = parse_allowed_hosts(args.allowed_hosts, args.host)
    limits = ServerLimits(
        max_n=args.max_n,
        max_prompts=args.max_prompts,
        max_stop=args.max_stop,
        max_stop_chars=args.max_stop_chars,
        max_prompt_tokens=args.max_prompt_tokens,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_request_tokens=args.max_request_tokens,
    )
    engine, model, tokenizer = _load_engine(args)
    name = args.served_model_name or (args.model if not Path(args.model).is_dir() else Path(args.model).name)
    return ServerState(
        engine=engine,
        codec=TextCodec(tokenizer),
        model_name=name,
        max_model_len=int(getattr(model.config, "max_position_embeddings", None) or tokenizer.model_max_length),
        eos_token_ids=_eos_ids(tokenizer, model),
        default_max_tokens=args.default_max_tokens,
        created=int(time.time()),
        limits=limits,
        weights_root=Path(args.weights_root).expanduser().resolve() if args.weights_root else None,
        allowed_hosts=allowed_hosts,
        api_key=args.api_key,
        tool_parser=get_tool_parser(args.tool_call_parser),
        control_routes=args.control_routes,
        max_weight_bucket_bytes=int(args.max_weight_bucket_mb * 1024 * 1024),
        control_token=args.control_token,
        processor=load_vision_processor(args.model),  # chat image_url parts need it
    )


def _load_engine(args: argparse.Namespace):
    """``(engine, model, tokenizer)``: the model on ``--device`` in ``--dtype`` and its engine."""
    import torch

    from hybridflow.inference.generation_engine import GenerationEngine
    from hybridflow.models import load_model_and_tokenizer, parse_dtype
    from hybridflow.utils.precision import resolve_compute_dtype

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = parse_dtype(resolve_compute_dtype(args.dtype, device))
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype, trust_remote_code=args.trust_remote_code)
    model = model.to(device)
    engine = GenerationEngine(
        model,
        int(tokenizer.pad_token_id),
        decoder=args.decoder,
        max_rows=args.max_batch_rows,
        batch_window_s=args.batch_window_ms / 1000.0,
        seed=args.seed,
        owns_weights=True,
        max_rows_per_group=args.max_request_rows,
    )
    return engine, model, tokenizer


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_serve_extra()
    if missing is not None:
        print(
            f"hybridflow serve: error: the 'serve' extra is not installed: no {missing}.\n"
            f"Install it with: {INSTALL_SERVE}",
            file=sys.stderr,
        )
        return 2
    try:
        check_can_listen(args.host, args.port)
    except OSError as err:
        print(f"hybridflow serve: error: {err}", file=sys.stderr)
        return 2
    keep_freed_memory()
    _limit_kernel_caches(args.kernel_cache)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvicorn

    from hybridflow.models import ModelLoadError
    from hybridflow.server.app import build_app

    try:
        state = build_state(args)
    except (ModelLoadError, FileNotFoundError, ValueError) as err:
        print(f"hybridflow serve: error: {err}", file=sys.stderr)
        return 2
    print(
        f"hybridflow serve: model {state.model_name!r} at http://{args.host}:{args.port}/v1"
        + (" (API key required)" if args.api_key else ""),
        flush=True,
    )
    if args.control_token_generated:
        # Printed so that the one who started the server can hand it to the trainer
        # (rollout engine_kwargs.api_key) or to curl; a new one is made at every start.
        print(
            f"hybridflow serve: control token (the control routes need 'Authorization: Bearer TOKEN'; "
            f"set {CONTROL_TOKEN_ENV} to choose it): {args.control_token}",
            flush=True,
        )
    uvicorn.run(
        build_app(state),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout_s,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
