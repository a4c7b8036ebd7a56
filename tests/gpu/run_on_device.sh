#!/usr/bin/env bash
# One command for a GPU host without ansible installed: install carried wheels (.whl/), install the
# collection, run the end-to-end test, the verify-clean benchmark and, with 2+ GPUs, the all_reduce bandwidth
# per NCCL profile; results under ${OUT:-/tmp/gpufleet-gpu-out}.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpufleet-gpu-out}; mkdir -p "$OUT"
export LANG=C.UTF-8 LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1
if ! python3 -c 'import ansible' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
python3 scripts/install-collection collections >/dev/null || exit 1
python3 -c 'import ansible, pynvml, torch; print("ansible", ansible.__version__, "torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
ls -la /usr/lib/python3*/sitecustomize.py /etc/python3*/sitecustomize.py 2>&1
rc=0
# NVLink multicast off in everything started here (the device's KINDS.md: all three).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 tests/gpu/e2e.py --out /tmp/e2e "$@" 2>&1 | tee "$OUT/e2e.txt" || rc=1
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
# At most 8 files come back: e2e.txt, e2e.json, e2e.tgz (all of /tmp/e2e + server and NCCL logs), the benchmarks.
mkdir -p /tmp/e2e/logs && cp -r /var/log/gpufleet/. /tmp/e2e/logs/ 2>/dev/null
tar -C /tmp -czf "$OUT/e2e.tgz" e2e 2>/dev/null
cp /tmp/e2e/e2e.json "$OUT/" 2>/dev/null
read -r -a bench_args <<< "${BENCH_ARGS:-}"
[ -n "${SKIP_BENCH:-}" ] || python3 bench/verify_clean.py --json "$OUT/verify_clean.json" "${bench_args[@]}" 2>&1 | tee "$OUT/verify_clean.txt" || rc=1
if [ "$(nvidia-smi -L | grep -c '^GPU ')" -gt 1 ] && [ -z "${SKIP_ALLREDUCE:-}" ]; then
  python3 bench/allreduce_bw.py --json "$OUT/allreduce_bw.json" 2>&1 | tee "$OUT/allreduce_bw.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit $rc
