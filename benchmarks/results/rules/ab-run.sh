#!/usr/bin/env bash
# A/B: benchmarks/state_scaling.py at 10k open users (RocksDB), HEAD (/work/main) vs b80d298 (/work/ab-prev), each run
# its own process, alternating, each started behind a gate (no pytest or other benchmark, 1-min load < 1.5).
set -u
OUT=/work/main/benchmarks/results/rules/ab
mkdir -p $OUT
gate() {
  for _ in $(seq 1 80); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    if ! pgrep -f "pytest|throughput.py|state_scaling.py" >/dev/null && awk "BEGIN{exit !($load < 1.5)}"; then return 0; fi
    sleep 15
  done
  echo "gate timed out (load $load)" >&2
}
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="head prev"; else order="prev head"; fi  # alternate which build goes first
  for b in $order; do
    [ $b = head ] && dir=/work/ab-head || dir=/work/ab-prev
    gate
    run=$OUT/state_scaling-$i-$b; mkdir -p $run
    { echo "build=$b dir=$dir commit=$(git -C $dir rev-parse --short HEAD) jar_md5=$(md5sum $dir/build/jvm/sessions-operator.jar | cut -c1-8)";
      echo "load_start=$(cat /proc/loadavg)"; } > $run/run-info.txt
    (cd $dir && PYTHONPATH=$dir /usr/bin/time -v /work/main/.venv/bin/python benchmarks/state_scaling.py \
        --provider rocksdb --users 10000 --results-dir $run > $run/stdout.txt 2> $run/stderr.txt)
    echo "rc=$? load_end=$(cat /proc/loadavg)" >> $run/run-info.txt
  done
done
echo done > $OUT/.finished
