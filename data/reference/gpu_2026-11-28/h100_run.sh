#!/bin/bash
set -u
T0=$(date +%s)
G=/tmp/g; mkdir -p $G
pack() { tar czf $OUT/g.tgz -C $G . 2>/dev/null; }
left() { echo $(( ${BUDGET:-300} - ($(date +%s) - T0) )); }
step() { local name=$1 secs=$2; shift 2
  local l=$(left); if [ $l -lt 20 ]; then echo "SKIP $name (left $l)"; return; fi
  [ $secs -gt $l ] && secs=$l; local s=$(date +%s)
  timeout $secs "$@" > $G/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - s ))s"; tail -n ${TAILN:-15} $G/$name.log; pack; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl && export PYTHONPATH=$PWD/.site:$PWD || exit 1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
TAILN=6 step bench 150 python3 tools/bench_gpu_vs_torch.py --benchmarks $G/benchmarks.md
TAILN=6 step bench_wgrad_on 120 python3 tools/bench_gpu_vs_torch.py --grad-accumulation-fusion on
TAILN=6 step bench_mbs4 120 python3 tools/bench_gpu_vs_torch.py --micro-batch-size 4
TAILN=60 step profile 150 python3 tools/profile_gpu_step.py --iters 3 --rows 12
echo "total $(( $(date +%s) - T0 ))s"
