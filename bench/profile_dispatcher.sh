#!/usr/bin/env bash
# Profile one dispatcher process during an end-to-end benchmark run with py-spy, and print where
# its time goes (inclusive share per frame, all threads). Usage, with DATABASE_URL set:
#   bench/profile_dispatcher.sh [notifications] [seconds]
# BENCH_FLAGS overrides the run's dispatcher flags (default "-c 500 -b 250"; versus.py uses
# "-c 2000 -b 1000"), PYSPY_FLAGS adds py-spy flags (e.g. --nonblocking), PYSPY_RATE sets samples
# per second (default 200).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-60000}
seconds=${2:-6}
out=$(mktemp -d)
.venv/bin/python manage.py omnipost_bench -n "$n" -p 2 ${BENCH_FLAGS:--c 500 -b 250} > "$out/bench.txt" 2>&1 &
bench=$!
pid=""
for _ in $(seq 1 1200); do
  pid=$(pgrep -f "benchmarks[.]dispatcher|manage[.]py run_dispatcher" | head -n 1 || true)
  [ -n "$pid" ] && break
  sleep 0.1
done
sleep 2
.venv/bin/py-spy record --pid "$pid" --duration "$seconds" --rate ${PYSPY_RATE:-200} ${PYSPY_FLAGS:-} --format raw --output "$out/profile.txt" >/dev/null 2>&1
cp "$out/profile.txt" /tmp/last_profile.txt 2>/dev/null || true
wait "$bench"
grep -E "delivery rate|statements" "$out/bench.txt"
.venv/bin/python - "$out/profile.txt" <<'PY'
import collections, sys
total = 0
inclusive = collections.Counter()
for line in open(sys.argv[1]):
    stack, count = line.rsplit(" ", 1)
    count = int(count)
    total += count
    for frame in set(stack.split(";")):
        inclusive[frame] += count
print(f"{total} samples; inclusive share per frame (top 30):")
for frame, count in inclusive.most_common(30):
    print(f"{count / total:6.1%}  {frame[:130]}")
PY
