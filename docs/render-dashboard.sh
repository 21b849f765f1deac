#!/usr/bin/env bash
# Renders docs/grafana-dashboard.png from a real run, without Grafana:
#   docs/render-dashboard.sh
# Starts its own redis-server, the observability example (examples/observability.rs: two cache
# instances stampeding on 6 keys, its Prometheus endpoint) and a real Prometheus scraping that
# endpoint every second (Debian's `prometheus` package), all on free loopback ports. After 50 s
# it kills the redis-server (an outage: the breaker opens, calls are computed uncached,
# invalidations queue) and starts a new, empty one 15 s later on the same port; the example
# stops at 120 s. Then docs/render_dashboard.py sends each panel's PromQL from
# docs/grafana-dashboard.json to that Prometheus (`$__rate_interval` = 10s) and draws the answers
# with matplotlib (Debian's `python3-matplotlib`). Every process it started is stopped by pid.
# Needs redis-server, prometheus and /usr/bin/python3 with matplotlib: apt-get install
# prometheus python3-matplotlib. Takes about two and a half minutes after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

free_port() {
  for _ in $(seq 50); do
    local candidate=$((20000 + RANDOM % 40000))
    # Free if nothing answers there.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "no free loopback port found" >&2
  exit 1
}
redis_port=$(free_port)
metrics_port=$(free_port)
prometheus_port=$(free_port)

cargo build --example observability --features metrics

dir=$(mktemp -d)
redis_pid="" prometheus_pid="" example_pid=""
start_redis() {
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    >>"$dir/redis.log" 2>&1 &
  redis_pid=$!
}
cleanup() {
  for pid in "$example_pid" "$prometheus_pid" "$redis_pid"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

start_redis
cat >"$dir/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: observability-example
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
YAML
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$prometheus_port" >"$dir/prometheus.log" 2>&1 &
prometheus_pid=$!

start=$(date +%s)
target/debug/examples/observability --url "redis://127.0.0.1:$redis_port/0" \
  --listen "127.0.0.1:$metrics_port" --seconds 120 >"$dir/example.out" 2>"$dir/example.err" &
example_pid=$!
sleep 50
echo "outage: redis-server stopped for 15 s" >&2
kill "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
sleep 15
start_redis
wait "$example_pid" || true
example_pid=""
sleep 3 # the last scrapes
end=$(date +%s)
/usr/bin/python3 docs/render_dashboard.py --prometheus "http://127.0.0.1:$prometheus_port" \
  --start "$start" --end "$end" --step 2s --rate-interval 10s \
  --dashboard docs/grafana-dashboard.json --out docs/grafana-dashboard.png
grep "calls by answer" "$dir/example.err" >&2 || true
