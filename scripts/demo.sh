#!/usr/bin/env bash
# turnout demo: 4 mock vLLM replicas + turnout + a proxy on loopback, a short
# mixed workload (multi-turn sessions, shared system prompts, streaming), then
# a table of requests and prefix-cache hits per replica and how turnout
# decided. Runs in the foreground; everything it starts is stopped on exit,
# Ctrl-C, SIGTERM, or when make is killed.
#
#   scripts/demo.sh                 # PROXY=haproxy (default)
#   PROXY=haproxy TURNOUT_BIN=... TURNOUT_LAB_BIN=... scripts/demo.sh
#   PROXY=nginx scripts/demo.sh     # nginx + njs
#   make demo PORT_BASE=18000       # every port shifted (see scripts/lib.sh)
#
# Ports default to the embedded config's (internal/config/default_config.yaml):
# replicas 127.0.0.1:8001-8004, turnout 127.0.0.1:9090, HAProxy 127.0.0.1:8080,
# nginx 127.0.0.1:8081, completion feedback (syslog/UDP) 127.0.0.1:9514.
set -euo pipefail

PROXY=${PROXY:-haproxy}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${TURNOUT_BIN:-$ROOT/bin/turnout}
LAB=${TURNOUT_LAB_BIN:-$ROOT/bin/turnout-lab} # the mock replicas
SCRIPT="make demo"
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
MODEL=meta-llama/Llama-3.1-8B-Instruct
REPLICAS=(llama-0 llama-1 llama-2 llama-3)
PORTS=("${MOCK_PORTS[@]}")

die() { echo "demo: $*" >&2; exit 1; }
# On a fresh Debian machine, install what the demo needs when we may (root
# with apt-get); otherwise say what is missing.
need_pkgs() {
  local missing=()
  for spec in "$@"; do
    local cmd=${spec%%:*} pkgs=${spec#*:}
    if [[ $cmd == /* ]]; then [[ -e $cmd ]] || missing+=($pkgs); else command -v "$cmd" >/dev/null || missing+=($pkgs); fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null && \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
  fi
}
need_pkgs curl:curl
command -v curl >/dev/null || die "curl is required"

if [[ ! -x $BIN ]]; then
  echo "building $BIN"
  (cd "$ROOT" && CGO_ENABLED=0 go build -o "$BIN" ./cmd/turnout) || die "build failed"
fi
if [[ ! -x $LAB ]]; then
  echo "building $LAB"
  (cd "$ROOT" && CGO_ENABLED=0 go build -o "$LAB" ./cmd/turnout-lab) || die "build failed"
fi

PROXY_PORT=$HAPROXY_PORT
[[ $PROXY == nginx ]] && PROXY_PORT=$NGINX_PORT
check_ports "tcp:$PROXY_PORT:$PROXY" "tcp:$TURNOUT_PORT:turnout" "udp:$FEEDBACK_PORT:completion feedback" \
  "tcp:${PORTS[0]}:mock llama-0" "tcp:${PORTS[1]}:mock llama-1" \
  "tcp:${PORTS[2]}:mock llama-2" "tcp:${PORTS[3]}:mock llama-3" || exit 1

WORK=$(mktemp -d "${TMPDIR:-/tmp}/turnout-demo.XXXXXX")
JOBS=()
cleanup() {
  local code=$?
  # Workload subshells first (and their curl), then the servers.
  for j in "${JOBS[@]}"; do pkill -TERM -P "$j" 2>/dev/null || true; kill "$j" 2>/dev/null || true; done
  demo_end "$code"
}
trap cleanup EXIT
trap_signals
write_config "$WORK/turnout.yaml"

echo "starting 4 mock replicas on 127.0.0.1:${PORTS[0]}-${PORTS[3]}"
for i in "${!REPLICAS[@]}"; do
  start_child "mock ${REPLICAS[$i]}" "$WORK/mock-$i.log" "$LAB" mock --listen "127.0.0.1:${PORTS[$i]}" \
    --name "${REPLICAS[$i]}" --model "$MODEL,llama" --strict-models --time-scale 0.05
done
for i in "${!REPLICAS[@]}"; do wait_http "mock ${REPLICAS[$i]}" "http://127.0.0.1:${PORTS[$i]}/health" || exit 1; done

case $PROXY in
haproxy)
  need_pkgs haproxy:haproxy
  command -v haproxy >/dev/null || die "haproxy is not installed (apt-get install -y haproxy)"
  DIR=$WORK/haproxy
  "$BIN" render haproxy --config "$WORK/turnout.yaml" --out "$DIR" 2>"$WORK/render.log"
  # turnout keeps the HAProxy pools in sync through the admin socket in $DIR.
  start_child "turnout serve" "$WORK/turnout.log" "$BIN" serve --config "$WORK/turnout.yaml" --haproxy-dir "$DIR"
  wait_http "turnout serve" "http://$TURNOUT/healthz" || exit 1
  start_child haproxy "$WORK/haproxy.log" haproxy -f "$DIR/haproxy.cfg"
  PROXY_URL=http://127.0.0.1:$HAPROXY_PORT
  ;;
nginx)
  need_pkgs nginx:nginx /usr/lib/nginx/modules/ngx_http_js_module.so:libnginx-mod-http-js
  command -v nginx >/dev/null || die "nginx is not installed (apt-get install -y nginx libnginx-mod-http-js)"
  [[ -f /usr/lib/nginx/modules/ngx_http_js_module.so ]] || die "njs is not installed (apt-get install -y libnginx-mod-http-js)"
  DIR=$WORK/nginx
  # Started as root, nginx workers would run as nobody, who cannot enter $WORK.
  NGX_USER=()
  [[ $(id -u) -eq 0 ]] && NGX_USER=(--nginx-user root)
  "$BIN" render nginx --config "$WORK/turnout.yaml" --out "$DIR" "${NGX_USER[@]}" 2>"$WORK/render.log"
  # turnout re-renders nginx.conf and reloads nginx when the replica set changes.
  start_child "turnout serve" "$WORK/turnout.log" "$BIN" serve --config "$WORK/turnout.yaml" --nginx-dir "$DIR" "${NGX_USER[@]}"
  wait_http "turnout serve" "http://$TURNOUT/healthz" || exit 1
  start_child nginx "$WORK/nginx.log" nginx -p "$DIR" -c "$DIR/nginx.conf" -e stderr -g 'daemon off;'
  PROXY_URL=http://127.0.0.1:$NGINX_PORT
  ;;
*)
  die "PROXY=$PROXY is not supported (haproxy, nginx)"
  ;;
esac
wait_http "$PROXY" "$PROXY_URL/v1/models" || exit 1
# HAProxy health-checks the replicas before it routes to them.
sleep 0.5
echo "proxy: $PROXY at $PROXY_URL, turnout at http://$TURNOUT"

HITS=$WORK/hits
: >"$HITS"
# chat SESSION STREAM MESSAGES_JSON: one request; records the serving replica.
chat() {
  local session=$1 stream=$2 messages=$3 hdr=()
  [[ -n $session ]] && hdr=(-H "X-Session-ID: $session")
  local body="{\"model\":\"$MODEL\",\"max_tokens\":8,\"stream\":$stream,\"stream_options\":{\"include_usage\":true},\"messages\":$messages}"
  local replica
  replica=$(curl -sS -N --max-time 30 -o /dev/null -D - "${hdr[@]}" -H 'Content-Type: application/json' \
    --data-binary "$body" "$PROXY_URL/v1/chat/completions" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-replica"{print $2}')
  echo "${replica:-none} $stream" >>"$HITS"
}
msg() { printf '{"role":"%s","content":"%s"}' "$1" "$2"; }

SYSTEMS=(
  "You are the support assistant of Acme Cloud. Answer briefly, cite the relevant product page, never invent prices. $(printf 'Acme policy clause %s applies. ' {1..40})"
  "You are a code reviewer for a Go service. Point out bugs first, then style, and keep each remark to one line. $(printf 'Review rule %s is mandatory. ' {1..40})"
  "You translate English product descriptions into French, keeping units and brand names untouched. $(printf 'Glossary entry %s must be respected. ' {1..40})"
)

echo "workload: 6 multi-turn sessions x 4 turns, 3 shared system prompts x 8 questions, every third request streamed"
# Workload jobs are waited for by pid: a bare "wait" would wait for the servers.
JOBS=()
wait_jobs() { for j in "${JOBS[@]}"; do wait "$j" || true; done; JOBS=(); }
n=0
# Multi-turn sessions: each turn resends the growing conversation.
for s in 1 2 3 4 5 6; do
  (
    conv=$(msg system "Session $s: you are a travel planner. $(printf 'Constraint %s. ' {1..30})")
    for turn in 1 2 3 4; do
      conv="$conv,$(msg user "Turn $turn of trip $s: suggest a stop")"
      stream=false
      ((turn % 3 == 0)) && stream=true
      chat "sess-$s" "$stream" "[$conv]"
      conv="$conv,$(msg assistant "Stop $turn for trip $s")"
    done
  ) &
  JOBS+=($!)
  ((++n % 3 == 0)) && wait_jobs
done
wait_jobs
# Shared system prompts, different questions, a few in parallel.
for q in 1 2 3 4 5 6 7 8; do
  for i in "${!SYSTEMS[@]}"; do
    stream=false
    (((q + i) % 3 == 0)) && stream=true
    chat "" "$stream" "[$(msg system "${SYSTEMS[$i]}"),$(msg user "Question $q about topic $i")]" &
    JOBS+=($!)
  done
  wait_jobs
done

echo
printf '%-10s %9s %9s %14s %14s %9s\n' replica requests streamed prompt_tokens cached_tokens hit_rate
total=0
for i in "${!REPLICAS[@]}"; do
  name=${REPLICAS[$i]}
  reqs=$(awk -v r="$name" '$1==r' "$HITS" | wc -l)
  streamed=$(awk -v r="$name" '$1==r && $2=="true"' "$HITS" | wc -l)
  metrics=$(curl -fsS "http://127.0.0.1:${PORTS[$i]}/metrics")
  queries=$(awk '/^vllm:prefix_cache_queries_total/{print $2}' <<<"$metrics")
  hits=$(awk '/^vllm:prefix_cache_hits_total/{print $2}' <<<"$metrics")
  rate=$(awk -v h="${hits:-0}" -v q="${queries:-0}" 'BEGIN{ if (q>0) printf "%.0f%%", 100*h/q; else print "-" }')
  printf '%-10s %9d %9d %14.0f %14.0f %9s\n' "$name" "$reqs" "$streamed" "${queries:-0}" "${hits:-0}" "$rate"
  total=$((total + reqs))
done
failed=$(awk '$1=="none"' "$HITS" | wc -l)
echo
echo "$total requests served through $PROXY, $failed without a replica answer"
metrics=$(curl -fsS "http://$TURNOUT/metrics")
# How turnout decided: affinity (session or prefix honoured), balanced (no
# key), overflow (its replica was too loaded), and the prefix blocks matched.
echo "turnout decisions: $(awk '/^turnout_decisions_total/{o=$0; sub(/.*outcome="/, "", o); sub(/".*/, "", o); n[o]+=$NF} END{for (k in n) if (n[k]) printf "%s=%d ", k, n[k]}' <<<"$metrics")"
echo "prefix blocks matched: $(awk '/^turnout_prefix_matched_blocks_total/{m+=$NF} /^turnout_prefix_blocks_total/{t+=$NF} END{printf "%d of %d", m, t}' <<<"$metrics")"
inflight=$(awk '/^turnout_endpoint_inflight/{s+=$2} END{print s+0}' <<<"$metrics")
echo "turnout in-flight after the run: $inflight (completion feedback closes each decision)"
[[ $failed -eq 0 ]] || exit 1
