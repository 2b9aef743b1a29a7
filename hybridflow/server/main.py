"""``hybridflow serve --model PATH`` (= ``python -m hybridflow.server.main``): start the HTTP server.

    hybridflow serve --model tiny-llama --port 8000
    hybridflow serve --model smollm2-135m-instruct --dtype bf16 --host 127.0.0.1 --port 8000

``--model`` is an HF folder or a known name (``tiny-llama``, ``smollm2-135m-instruct``).
The server listens on 127.0.0.1 unless ``--host`` says otherwise; it has no authentication,
so expose it only on networks you trust.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import torch

from hybridflow.models import ModelLoadError, load_model_and_tokenizer, parse_dtype
from hybridflow.server.app import ServerState, build_app
from hybridflow.server.engine import GenerationEngine
from hybridflow.server.text import TextCodec
from hybridflow.utils.precision import resolve_compute_dtype
from hybridflow.workers.rollout.torch_rollout import DECODERS
from hybridflow.utils.allocator import keep_freed_memory


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hybridflow serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True,
                        help="HF model folder or known name (tiny-llama, smollm2-135m-instruct)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                        help="weights and compute dtype; auto (default) = bf16 where the hardware has a native "
                        "bf16 matmul, else fp32")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto = cuda if available")
    parser.add_argument("--served-model-name", default=None, help="the `model` name clients send (default: --model)")
    parser.add_argument("--decoder", default="auto", choices=list(DECODERS), help="sampler forward: lean, hf or auto")
    parser.add_argument("--max-batch-rows", type=int, default=64, help="most sequences decoded in one forward")
    parser.add_argument("--batch-window-ms", type=float, default=0.0,
                        help="an idle server waits this long after a request for more to start together (default 0)")
    parser.add_argument("--default-max-tokens", type=int, default=512,
                        help="reply limit when a request gives none (capped by the context)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler for requests without a seed")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--trust-remote-code", action="store_true", help="allow custom model code in the folder")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for name in ("max_batch_rows", "default_max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch_window_ms < 0:
        parser.error("--batch-window-ms must be >= 0")
    return args


def _eos_ids(tokenizer, model) -> tuple[int, ...]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (an int or a list)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    generation_config = getattr(model, "generation_config", None)
    extra = getattr(generation_config, "eos_token_id", None)
    ids += extra if isinstance(extra, list) else ([extra] if extra is not None else [])
    return tuple(dict.fromkeys(int(i) for i in ids))


def build_state(args: argparse.Namespace) -> ServerState:
    """Load the model and tokenizer and wire the engine (not started yet)."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = parse_dtype(resolve_compute_dtype(args.dtype, device))
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype,
                                                trust_remote_code=args.trust_remote_code)
    model = model.to(device)
    engine = GenerationEngine(
        model,
        int(tokenizer.pad_token_id),
        decoder=args.decoder,
        max_rows=args.max_batch_rows,
        batch_window_s=args.batch_window_ms / 1000.0,
        seed=args.seed,
    )
    name = args.served_model_name or (args.model if not Path(args.model).is_dir() else Path(args.model).name)
    return ServerState(
        engine=engine,
        codec=TextCodec(tokenizer),
        model_name=name,
        max_model_len=int(getattr(model.config, "max_position_embeddings", None) or tokenizer.model_max_length),
        eos_token_ids=_eos_ids(tokenizer, model),
        default_max_tokens=args.default_max_tokens,
        created=int(time.time()),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    keep_freed_memory()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import uvicorn  # only the serve command needs the ASGI server

    try:
        state = build_state(args)
    except (ModelLoadError, FileNotFoundError, ValueError) as err:
        print(f"hybridflow serve: error: {err}", file=sys.stderr)
        return 2
    print(f"hybridflow serve: model {state.model_name!r} at http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
