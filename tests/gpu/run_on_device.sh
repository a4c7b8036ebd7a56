#!/usr/bin/env bash
# One command for a GPU host without ansible installed: install carried wheels (.whl/), install the
# collection, run the end-to-end test and the verify-clean benchmark; results under ${OUT:-/tmp/gpufleet-gpu-out}.
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
python3 tests/gpu/e2e.py --out /tmp/e2e "$@" 2>&1 | tee "$OUT/e2e.txt" || rc=1
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
tar -C /tmp -czf "$OUT/e2e.tgz" e2e 2>/dev/null
cp /tmp/e2e/e2e.json /tmp/e2e/process_env.log "$OUT/" 2>/dev/null; cp /var/log/gpufleet/gpu-e2e.log "$OUT/server.log" 2>/dev/null; tar -C /var/log/gpufleet -czf "$OUT/nccl-logs.tgz" . 2>/dev/null
read -r -a bench_args <<< "${BENCH_ARGS:-}"
[ -n "${SKIP_BENCH:-}" ] || python3 bench/verify_clean.py --json "$OUT/verify_clean.json" "${bench_args[@]}" 2>&1 | tee "$OUT/verify_clean.txt" || rc=1
exit $rc
