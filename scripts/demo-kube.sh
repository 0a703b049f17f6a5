#!/usr/bin/env bash
# make demo K8S=1: turnout follows a Kubernetes fleet. A local kube-apiserver
# (scripts/kube-apiserver.sh, built once from the Go module proxy and cached)
# and etcd run with RBAC on; turnout watches the EndpointSlices of a vllm-pd
# Service with only the Role of deploy/kubernetes/rbac.yaml, and keeps HAProxy
# in line over its runtime API while streaming prefill/decode requests run.
# The demo scales decode 2 -> 6, turns one pod terminating, scales back to 2,
# and prints the pools and who served what after each step.
#
# Runs as root inside its own network namespace (unshare -n): EndpointSlices
# refuse loopback addresses, so the mock replicas listen on 10.244.0.x there;
# nothing leaves the namespace. Everything it starts is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${TURNOUT_BIN:-$ROOT/bin/turnout}
LAB=${TURNOUT_LAB_BIN:-$ROOT/bin/turnout-lab} # the mock replicas
SCRIPT="make demo K8S=1"
die() { echo "demo: $*" >&2; exit 1; }

if [[ -z ${TURNOUT_DEMO_NETNS:-} ]]; then
  [[ $(id -u) -eq 0 ]] || die "run as root: the demo creates a network namespace (unshare -n)"
  missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v haproxy >/dev/null || missing+=(haproxy)
  command -v curl >/dev/null || missing+=(curl)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v ip >/dev/null || missing+=(iproute2)
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "installing ${missing[*]} (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    service etcd stop >/dev/null 2>&1 || true
    service haproxy stop >/dev/null 2>&1 || true
  fi
  { [[ -x $BIN && -x $LAB ]] || (cd "$ROOT" && make build >/dev/null); } || die "build failed"
  KUBE_APISERVER=$(bash "$ROOT/scripts/kube-apiserver.sh") || die "no kube-apiserver (scripts/kube-apiserver.sh)"
  export KUBE_APISERVER TURNOUT_BIN=$BIN TURNOUT_LAB_BIN=$LAB TURNOUT_DEMO_NETNS=1
  exec unshare -n bash "${BASH_SOURCE[0]}"
fi

# ---- inside the network namespace ----
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
ip link set lo up
for i in 1 20 21 22 23 24 25 26; do ip addr add "10.244.0.$i/32" dev lo; done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/turnout-kube-demo.XXXXXX")
cleanup() {
  local code=$?
  [[ -n ${LOAD_PID:-} ]] && { pkill -TERM -P "$LOAD_PID" 2>/dev/null || true; kill "$LOAD_PID" 2>/dev/null || true; }
  demo_end "$code"
}
trap cleanup EXIT
trap_signals

ADMIN=demo-admin-token TURNOUT_TOKEN=demo-turnout-token NS=llm
API=https://127.0.0.1:6443
echo "starting etcd and kube-apiserver ($KUBE_APISERVER), RBAC on"
start_child etcd "$WORK/etcd.log" etcd --data-dir "$WORK/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --log-level error
openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
cat >"$WORK/tokens.csv" <<EOF
$ADMIN,admin,admin,"system:masters"
$TURNOUT_TOKEN,system:serviceaccount:$NS:turnout,turnout-uid,"system:serviceaccounts,system:serviceaccounts:$NS"
EOF
start_child kube-apiserver "$WORK/kube-apiserver.log" "$KUBE_APISERVER" \
  --etcd-servers http://127.0.0.1:2379 --bind-address 127.0.0.1 --secure-port 6443 --advertise-address 10.244.0.1 \
  --cert-dir "$WORK/certs" --token-auth-file "$WORK/tokens.csv" --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$WORK/sa.key" \
  --service-account-signing-key-file "$WORK/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
  --disable-admission-plugins ServiceAccount --enable-priority-and-fairness=false --endpoint-reconciler-type none
# api METHOD PATH [CONTENT-TYPE] < body
api() {
  curl -sS -k --fail-with-body -o "$WORK/api.out" -X "$1" -H "Authorization: Bearer $ADMIN" \
    -H "Content-Type: ${3:-application/json}" --data-binary @- "$API$2" ||
    { echo "demo: $1 $2 failed: $(cat "$WORK/api.out")" >&2; return 1; }
}
for ((i = 0; i < 450; i++)); do
  [[ $(curl -sk -H "Authorization: Bearer $ADMIN" "$API/readyz" 2>/dev/null) == ok ]] && break
  check_children || exit 1
  sleep 0.2
done
[[ $(curl -sk -H "Authorization: Bearer $ADMIN" "$API/readyz") == ok ]] || die "kube-apiserver not ready in 90 s"

echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"'$NS'"}}' | api POST /api/v1/namespaces
# deploy/kubernetes/rbac.yaml as is: ServiceAccount, Role, RoleBinding.
awk -v dir="$WORK" 'BEGIN{n=0} /^---/{n++; next} {print > (dir "/rbac-" n ".yaml")}' "$ROOT/deploy/kubernetes/rbac.yaml"
for f in "$WORK"/rbac-*.yaml; do
  case $(sed -n 's/^kind: //p' "$f") in
  ServiceAccount) api POST "/api/v1/namespaces/$NS/serviceaccounts" application/yaml <"$f" ;;
  Role) api POST "/apis/rbac.authorization.k8s.io/v1/namespaces/$NS/roles" application/yaml <"$f" ;;
  RoleBinding) api POST "/apis/rbac.authorization.k8s.io/v1/namespaces/$NS/rolebindings" application/yaml <"$f" ;;
  esac
done

# Replicas: prefill p-0 and decode d-0..d-5 (mock vLLM), with their pods.
pod() {
  echo '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"'$1'","labels":{"vllm-role":"'$2'"}},"spec":{"automountServiceAccountToken":false,"containers":[{"name":"vllm","image":"vllm/vllm-openai"}]}}' |
    api POST "/api/v1/namespaces/$NS/pods"
}
start_child "mock p-0" "$WORK/mock-p-0.log" "$LAB" mock --listen 10.244.0.20:8000 --name p-0 --role prefill --model llama --time-scale 0.2
pod p-0 prefill
for i in 0 1 2 3 4 5; do
  start_child "mock d-$i" "$WORK/mock-d-$i.log" "$LAB" mock --listen "10.244.0.$((21 + i)):8000" --name "d-$i" --role decode --model llama --time-scale 0.2
  pod "d-$i" decode
done
# slice N [TERMINATING]: the vllm-pd Service's EndpointSlice with p-0 and d-0..d-(N-1).
ep() { echo '{"addresses":["'$2'"],"conditions":{"ready":'$3',"serving":true,"terminating":'$4'},"targetRef":{"kind":"Pod","namespace":"'$NS'","name":"'$1'"}}'; }
slice_json() {
  local eps i term
  eps=$(ep p-0 10.244.0.20 true false)
  for ((i = 0; i < $1; i++)); do
    term=false
    [[ ${2:-} == "d-$i" ]] && term=true
    eps+=,$(ep "d-$i" "10.244.0.$((21 + i))" "$([[ $term == true ]] && echo false || echo true)" $term)
  done
  echo '{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"vllm-pd-a","labels":{"kubernetes.io/service-name":"vllm-pd"}},"addressType":"IPv4","ports":[{"name":"http","port":8000}],"endpoints":['"$eps"']}'
}
slice_json 2 | api POST "/apis/discovery.k8s.io/v1/namespaces/$NS/endpointslices"
scale() { slice_json "$@" | api PATCH "/apis/discovery.k8s.io/v1/namespaces/$NS/endpointslices/vllm-pd-a" application/merge-patch+json; }

cat >"$WORK/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$API", certificate-authority: "$WORK/certs/apiserver.crt"}}]
users: [{name: turnout, user: {token: "$TURNOUT_TOKEN"}}]
contexts: [{name: demo, context: {cluster: demo, user: turnout, namespace: $NS}}]
current-context: demo
EOF
cat >"$WORK/turnout.yaml" <<EOF
listen: 127.0.0.1:9090
feedback: {syslog: 127.0.0.1:9514}
health: {interval: 1s, timeout: 500ms}
haproxy: {listen: 127.0.0.1:8080, dir: $WORK/haproxy, drain_timeout: 30s}
deployments:
  - name: llama
    models: [llama]
    policy: {name: least-request}
    pd: {prefill_timeout: 10s}
    pools:
      - role: prefill
        discovery: {kubernetes: {namespace: $NS, service: vllm-pd, port: http, role_label: vllm-role}}
      - role: decode
        discovery: {kubernetes: {namespace: $NS, service: vllm-pd, port: http, role_label: vllm-role}}
EOF
echo "starting turnout (kubeconfig with the turnout ServiceAccount's token) and HAProxy"
start_child "turnout serve" "$WORK/turnout.log" "$BIN" serve --config "$WORK/turnout.yaml" \
  --haproxy-dir "$WORK/haproxy" --kubeconfig "$WORK/kubeconfig"
wait_http "turnout serve" http://127.0.0.1:9090/healthz || exit 1
for ((i = 0; i < 150; i++)); do [[ -s $WORK/haproxy/haproxy.cfg ]] && break; sleep 0.1; done
start_child haproxy "$WORK/haproxy.log" haproxy -f "$WORK/haproxy/haproxy.cfg"
wait_http haproxy http://127.0.0.1:8080/v1/models || exit 1
wait_http "turnout ready" http://127.0.0.1:9090/readyz || exit 1
HA_MASTER=$(cat "$WORK/haproxy/haproxy.pid")

# Steady streaming load: 4 clients, each request records its decode replica.
HITS=$WORK/hits
: >"$HITS"
load() {
  local body='{"model":"llama","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"tell me about turnouts"}]}'
  local out=$WORK/body.$BASHPID r
  while [[ ! -f $WORK/stop ]]; do
    r=$(curl -sS -N --max-time 30 -o "$out" -D - -H 'Content-Type: application/json' \
      --data-binary "$body" http://127.0.0.1:8080/v1/chat/completions | tr -d '\r' | awk -F': ' 'tolower($1)=="x-replica"{print $2}') || true
    if grep -q 'data: \[DONE\]' "$out" 2>/dev/null; then echo "${r:-none}" >>"$HITS"; else echo "FAILED" >>"$HITS"; fi
  done
}
(for _ in 1 2 3 4; do load & done; wait) &
LOAD_PID=$!

MARK=0
# show TITLE: the pools turnout discovered last, then who served since the last step.
show() {
  sleep "${2:-3}"
  echo
  echo "== $1"
  grep '"discovered pool"' "$WORK/turnout.log" | tail -n 2 |
    sed -E 's/.*"pool":"([^"]*)".*"ready":\[([^]]*)\].*"draining":\[([^]]*)\].*/  pool \1: ready [\2]  draining [\3]/; s/"//g'
  local n
  n=$(wc -l <"$HITS")
  echo "  completed since the last step, by decode replica: $(sed -n "$((MARK + 1)),${n}p" "$HITS" | sort | uniq -c | awk '{printf "%s=%s ", $2, $1}')"
  MARK=$n
}
show "start: 2 decode + 1 prefill endpoints ready"
echo; echo ">> scale decode 2 -> 6 (one EndpointSlice update)"
scale 6
show "after the scale-up"
echo; echo ">> pod d-5 turns terminating (serving, not ready)"
scale 6 d-5
show "d-5 draining: no new requests, its streams finish"
echo; echo ">> scale decode 6 -> 2"
scale 2
show "after the scale-down"

touch "$WORK/stop"
wait "$LOAD_PID" || true
LOAD_PID=
echo
echo "requests: $(grep -vc FAILED "$HITS") complete, $(grep -c FAILED "$HITS" || true) failed or truncated"
echo "HAProxy master pid $HA_MASTER -> $(cat "$WORK/haproxy/haproxy.pid"); turnout reloaded HAProxy $(grep -c 'reloading HAProxy' "$WORK/turnout.log" || true) times (pool changes go over the runtime API)"
