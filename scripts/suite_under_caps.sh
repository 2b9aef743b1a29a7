#!/usr/bin/env bash
# Run the test suite under one ISA cap and one torch thread count (docs/testing.md, "Under
# every CPU kind"), then print the CPU kind, the settings, pytest's summary and the wall time.
#
#   scripts/suite_under_caps.sh CAP THREADS [pytest args...]
#
# CAP: native | avx2 | avx512_core | avx512_core_bf16 | avx512_core_amx | novec
# A cap can only lower what the CPU has; asking for more than it has is refused.
set -euo pipefail
cap="${1:?CAP: native, avx2, avx512_core, avx512_core_bf16, avx512_core_amx or novec}"
threads="${2:?THREADS: 1 or 2}"
shift 2
cd "$(dirname "$0")/.."

flags=$(grep -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
need() {
  case " $flags " in *" $1 "*) ;; *) echo "this CPU has no $1 (flags: $flags): cap $cap cannot be set" >&2; exit 2 ;; esac
}
case "$cap" in
  native) ;;
  avx2) export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  avx512_core) need avx512f; export ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE ;;
  avx512_core_bf16) need avx512_bf16; export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ;;
  avx512_core_amx) need amx_bf16; export ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX ;;
  novec) export ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 ;;
  *) echo "unknown cap '$cap'" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"

echo "CPU flags: $flags"
echo "cap: $cap (ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-}" \
     "MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-}), torch threads: $threads"
python3 -c "import torch; print('torch', torch.__version__, 'capability', torch.backends.cpu.get_cpu_capability(), 'threads', torch.get_num_threads())"
start=$(date +%s)
status=0
python3 -m pytest -q -p no:cacheprovider tests "$@" || status=$?
echo "suite wall time: $(( $(date +%s) - start )) s (cap $cap, $threads thread(s)), exit $status"
exit "$status"
