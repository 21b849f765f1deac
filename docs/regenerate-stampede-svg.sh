#!/usr/bin/env bash
# Regenerates docs/stampede.svg from a real run of the load generator, both modes:
#   docs/regenerate-stampede-svg.sh
# Starts its own redis-server on a free loopback port (needs redis-server and redis-cli on PATH),
# runs examples/stampede_bench at P=8, T=50 (400 callers), K=12, C=200 ms, 3 rounds, naive then
# guarded, keeps their JSON lines in docs/stampede-run/, plots them, and stops the server by pid.
# Takes a few minutes the first time (release build), then about half a minute.
set -euo pipefail
cd "$(dirname "$0")/.."

port=""
for _ in $(seq 50); do
  candidate=$((20000 + RANDOM % 40000))
  # Free if nothing answers there.
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
    port=$candidate
    break
  fi
done
[ -n "$port" ] || { echo "no free loopback port found" >&2; exit 1; }

cargo build --release --example stampede_bench
cargo build --example plot_stampede

dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  >"$dir/redis.log" 2>&1 &
redis_pid=$!
cleanup() {
  kill "$redis_pid" 2>/dev/null || true
  wait "$redis_pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
  [ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ] && break
  sleep 0.1
done
[ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ] || { cat "$dir/redis.log" >&2; exit 1; }

mkdir -p docs/stampede-run
for mode in naive guarded; do
  echo "running $mode..." >&2
  target/release/examples/stampede_bench --url "redis://127.0.0.1:$port/0" \
    --processes 8 --tasks 50 --keys 12 --compute-ms 200 --rounds 3 --mode "$mode" \
    >"docs/stampede-run/$mode.jsonl"
done
target/debug/examples/plot_stampede docs/stampede-run/naive.jsonl \
  docs/stampede-run/guarded.jsonl docs/stampede.svg
