#!/usr/bin/env bash
# turnout Kubernetes discovery demo (make demo-k8s, or make demo K8S=1): a
# real etcd + kube-apiserver, turnout following EndpointSlices with the Role
# of deploy/kubernetes/rbac.yaml, HAProxy, and mock vLLM replicas (one
# prefill, up to four decode). It scales the decode pool 2 -> 4 -> 2 by
# writing EndpointSlices and prints, at each step, HAProxy's runtime state
# (`show servers state`), turnout's view (/metrics) and where requests went.
#
# EndpointSlice validation refuses loopback addresses, so everything runs in
# a private network namespace (unshare -n, needs root) with 10.244.0.x on its
# lo: no traffic leaves it and no host port is used. Needs etcd (etcd-server),
# haproxy, curl, openssl, socat (installed with apt-get when run as root) and
# the kube-apiserver binary (built and cached by scripts/kube-apiserver.sh:
# several minutes the first time).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${TURNOUT_BIN:-$ROOT/bin/turnout}
NS=llm
API=https://127.0.0.1:6443
ADMIN_TOKEN=demo-admin-token
TURNOUT_TOKEN=demo-turnout-token
TURNOUT=127.0.0.1:9090
PROXY_URL=http://127.0.0.1:8080
MODEL=llama

die() { echo "demo-k8s: $*" >&2; exit 1; }

if [[ ${TURNOUT_DEMO_NETNS:-} != 1 ]]; then
  # Outside: check and install what is needed, then run again in a namespace.
  missing=()
  for spec in haproxy:haproxy etcd:etcd-server curl:curl openssl:openssl socat:socat unshare:util-linux ip:iproute2; do
    command -v "${spec%%:*}" >/dev/null || missing+=("${spec#*:}")
  done
  if [[ ${#missing[@]} -gt 0 && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      die "apt-get install ${missing[*]} failed"
  elif [[ ${#missing[@]} -gt 0 ]]; then
    die "missing packages: ${missing[*]} (apt-get install -y ${missing[*]})"
  fi
  unshare -n true 2>/dev/null || die "cannot create a network namespace (unshare -n needs root or CAP_SYS_ADMIN)"
  if [[ ! -x $BIN ]]; then
    echo "building $BIN"
    (cd "$ROOT" && CGO_ENABLED=0 go build -o "$BIN" ./cmd/turnout) || die "build failed"
  fi
  KUBE_APISERVER=$(bash "$ROOT/scripts/kube-apiserver.sh") || die "no kube-apiserver (scripts/kube-apiserver.sh failed)"
  exec unshare -n env TURNOUT_DEMO_NETNS=1 KUBE_APISERVER="$KUBE_APISERVER" TURNOUT_BIN="$BIN" bash "${BASH_SOURCE[0]}"
fi

# ---- inside the network namespace ----
ip link set lo up
ip addr add 10.244.0.1/32 dev lo # the API server's advertised address
for i in 10 11 12 13 14; do ip addr add "10.244.0.$i/32" dev lo; done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/turnout-demo-k8s.XXXXXX")
PIDS=()
cleanup() {
  local code=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $code -ne 0 ]]; then
    echo "demo-k8s failed; last log lines:" >&2
    for f in "$WORK"/*.log; do [[ -f $f ]] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
  fi
  [[ -n ${KEEP:-} ]] && echo "logs kept in $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT
start() { # start NAME CMD...: background, logged to $WORK/NAME.log, stopped on exit
  local name=$1
  shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
}
until_ok() { # until_ok WHAT TRIES CMD...: retry every 0.1 s
  local what=$1 tries=$2 i
  shift 2
  for ((i = 0; i < tries; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "$what did not come up"
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

echo "starting etcd and kube-apiserver (token auth, RBAC) in a private network namespace"
start etcd etcd --data-dir "$WORK/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --log-level error
openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
cat >"$WORK/tokens.csv" <<EOF
$ADMIN_TOKEN,admin,admin,"system:masters"
$TURNOUT_TOKEN,system:serviceaccount:$NS:turnout,turnout-uid,"system:serviceaccounts,system:serviceaccounts:$NS"
EOF
start kube-apiserver "$KUBE_APISERVER" --etcd-servers http://127.0.0.1:2379 --bind-address 127.0.0.1 --secure-port 6443 \
  --advertise-address 10.244.0.1 --cert-dir "$WORK/certs" --token-auth-file "$WORK/tokens.csv" --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$WORK/sa.key" \
  --service-account-signing-key-file "$WORK/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
  --disable-admission-plugins ServiceAccount --enable-priority-and-fairness=false --endpoint-reconciler-type none
CA=$WORK/certs/apiserver.crt
kapi() { curl -fsS --cacert "$CA" -H "Authorization: Bearer $ADMIN_TOKEN" "$@"; }
until_ok "kube-apiserver" 900 kapi "$API/readyz"

# apply PATH NAME: server-side apply of the YAML on stdin (what kubectl apply
# --server-side does), so every write below is the whole object.
apply() {
  kapi -o /dev/null -X PATCH -H 'Content-Type: application/apply-patch+yaml' \
    "$API$1/$2?fieldManager=turnout-demo&force=true" --data-binary @- || die "apply $1/$2 failed"
}
# apply_file FILE: every document of a manifest file.
apply_file() {
  local doc kind name path
  awk -v dir="$WORK" 'BEGIN{n=0} /^---/{n++; next} {print > (dir "/doc-" n ".yaml")}' "$1"
  for doc in "$WORK"/doc-*.yaml; do
    kind=$(awk '/^kind:/{print $2; exit}' "$doc")
    name=$(awk '/^metadata:/{m=1; next} m && /^  name:/{print $2; exit}' "$doc")
    case $kind in
    ServiceAccount) path=/api/v1/namespaces/$NS/serviceaccounts ;;
    Role) path=/apis/rbac.authorization.k8s.io/v1/namespaces/$NS/roles ;;
    RoleBinding) path=/apis/rbac.authorization.k8s.io/v1/namespaces/$NS/rolebindings ;;
    "") continue ;;
    *) die "apply_file: $kind not handled" ;;
    esac
    apply "$path" "$name" <"$doc"
  done
  rm -f "$WORK"/doc-*.yaml
}
printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n' "$NS" | apply /api/v1/namespaces "$NS"
apply_file "$ROOT/deploy/kubernetes/rbac.yaml"
echo "namespace $NS, turnout's ServiceAccount, Role and RoleBinding from deploy/kubernetes/rbac.yaml"

# Pods carry the role label that splits one Service into prefill and decode
# (no kubelet here: the objects only). Replicas: p-0 prefill, d-0..d-3 decode.
PODS=(p-0 d-0 d-1 d-2 d-3)
ROLES=(prefill decode decode decode decode)
IPS=(10.244.0.10 10.244.0.11 10.244.0.12 10.244.0.13 10.244.0.14)
for i in "${!PODS[@]}"; do
  apply "/api/v1/namespaces/$NS/pods" "${PODS[$i]}" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: ${PODS[$i]}, namespace: $NS, labels: {app: vllm, vllm-role: ${ROLES[$i]}}}
spec: {containers: [{name: vllm, image: vllm/vllm-openai}]}
EOF
  start "mock-${PODS[$i]}" "$TURNOUT_BIN" mock --listen "${IPS[$i]}:8000" --name "${PODS[$i]}" --role "${ROLES[$i]}" \
    --model "$MODEL" --time-scale 0.05
done

# slice N_DECODE [TERMINATING...]: write Service vllm's EndpointSlice with
# p-0 and the first N_DECODE decode pods; the named ones are terminating
# (still serving), as the EndpointSlice controller marks a pod being deleted.
slice() {
  local n=$1 i ready term eps=""
  shift
  for ((i = 0; i <= n; i++)); do
    ready=true term=false
    for t in "$@"; do [[ $t == "${PODS[$i]}" ]] && ready=false term=true; done
    eps+="
  - addresses: [${IPS[$i]}]
    conditions: {ready: $ready, serving: true, terminating: $term}
    targetRef: {kind: Pod, namespace: $NS, name: ${PODS[$i]}}"
  done
  apply "/apis/discovery.k8s.io/v1/namespaces/$NS/endpointslices" vllm-a <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: vllm-a, namespace: $NS, labels: {kubernetes.io/service-name: vllm}}
addressType: IPv4
ports: [{name: http, port: 8000, protocol: TCP}]
endpoints:$eps
EOF
}
slice 2

cat >"$WORK/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$API", certificate-authority: "$CA"}}]
users: [{name: turnout, user: {token: "$TURNOUT_TOKEN"}}]
contexts: [{name: demo, context: {cluster: demo, user: turnout, namespace: $NS}}]
current-context: demo
EOF
cat >"$WORK/turnout.yaml" <<EOF
listen: $TURNOUT
feedback: {syslog: 127.0.0.1:9514}
health: {interval: 1s, timeout: 500ms}
haproxy: {listen: 127.0.0.1:8080, dir: $WORK/haproxy, drain_timeout: 5s}
deployments:
  - name: llama
    models: [$MODEL]
    policy: {name: round-robin}   # sequential requests: shows every decode replica in use
    pd: {prefill_timeout: 5s}
    pools:   # one Service, split by the pods' vllm-role label
      - role: prefill
        discovery: {kubernetes: {namespace: $NS, service: vllm, port: http, role_label: vllm-role}}
      - role: decode
        discovery: {kubernetes: {namespace: $NS, service: vllm, port: http, role_label: vllm-role}}
EOF
echo "starting turnout (kubernetes discovery, token of ServiceAccount turnout) and HAProxy"
start turnout "$TURNOUT_BIN" serve --config "$WORK/turnout.yaml" --haproxy-dir "$WORK/haproxy" --kubeconfig "$WORK/kubeconfig"
until_ok "turnout's haproxy.cfg" 300 test -s "$WORK/haproxy/haproxy.cfg"
start haproxy haproxy -f "$WORK/haproxy/haproxy.cfg"
SOCK=$WORK/haproxy/admin.sock
hacmd() { echo "$1" | socat -t 2 - "UNIX-CONNECT:$SOCK"; }
until_ok "HAProxy admin socket" 100 hacmd "show info"

# servers BACKEND: "name=STATE" for each server in HAProxy's runtime state
# (UP/DOWN from its health checks, DRAIN, MAINT from the admin state).
servers() {
  hacmd "show servers state $1" | awk 'NF >= 19 && $1 !~ /^#/ {
    st = ($6 == 2) ? "UP" : "DOWN"
    a = $7 + 0   # srv_admin_state: 0x18 drain, 0x27 maintenance (no bit ops in mawk)
    if (a % 32 >= 8) st = "DRAIN"
    if (a % 8 > 0 || int(a / 32) % 2 == 1) st = "MAINT"
    printf "%s%s=%s", sep, $4, st; sep = " " }'
}
# turnout_view POOL: turnout's endpoints of POOL and whether it routes to them.
turnout_view() {
  curl -fsS "http://$TURNOUT/metrics" | awk -v p="$1" -F'[{}]' '$1 == "turnout_endpoint_up" && index($2, "pool=\"" p "\"") {
    e = $2; sub(/.*endpoint="/, "", e); sub(/".*/, "", e); split($3, v, " ")
    printf "%s%s=%s", sep, e, (v[1] == 1 ? "available" : "not-available"); sep = " " }'
}
show() {
  echo "  HAProxy llama_prefill: $(servers llama_prefill)"
  echo "  HAProxy llama_decode:  $(servers llama_decode)"
  echo "  turnout llama_decode:  $(turnout_view llama_decode)"
}
# requests N: N chat requests through HAProxy (every other one streamed);
# prints which decode replica answered each (X-Replica).
requests() {
  local n=$1 i stream out=""
  for ((i = 0; i < n; i++)); do
    stream=false
    ((i % 2)) && stream=true
    out+=" $(curl -sS -N --max-time 20 -o /dev/null -D - -H 'Content-Type: application/json' \
      --data-binary "{\"model\":\"$MODEL\",\"max_tokens\":4,\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"request $i\"}]}" \
      "$PROXY_URL/v1/chat/completions" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-replica"{r=$2} END{print (r == "" ? "FAILED" : r)}')"
  done
  echo "  $n requests (PD: prefill on p-0, decode on):$(tr ' ' '\n' <<<"$out" | sed '/^$/d' | sort | uniq -c | awk '{printf " %s x%d", $2, $1}')"
  [[ $out != *FAILED* ]] || die "a request failed"
}
# wait_state WHAT WANT: poll HAProxy's decode backend until it reads WANT;
# prints the time since the EndpointSlice write (T0).
wait_state() {
  local i
  for ((i = 0; i < 1000; i++)); do
    if [[ $(servers llama_decode) == "$2" ]]; then
      [[ -n $T0 ]] && echo "  HAProxy shows $1 $(($(now_ms) - T0)) ms after the EndpointSlice write"
      return 0
    fi
    sleep 0.01
  done
  die "HAProxy did not reach '$2' (has '$(servers llama_decode)')"
}
pid_of_worker() { hacmd "show info" | awk -F': ' '$1 == "Pid" {print $2}'; }

T0=
wait_state "2 decode servers UP" "d-0=UP d-1=UP"
until_ok "turnout /readyz" 100 curl -fsS "http://$TURNOUT/readyz"
WORKER=$(pid_of_worker)
echo
echo "== start: 1 prefill + 2 decode endpoints"
show
requests 6

echo
echo "== scale decode 2 -> 4 (d-2, d-3 ready)"
T0=$(now_ms)
slice 4
wait_state "4 decode servers UP (health-checked)" "d-0=UP d-1=UP d-2=UP d-3=UP"
show
requests 8

echo
echo "== scale decode 4 -> 2, step 1: d-2, d-3 terminating (still serving their streams)"
T0=$(now_ms)
slice 4 d-2 d-3
wait_state "d-2, d-3 in drain" "d-0=UP d-1=UP d-2=DRAIN d-3=DRAIN"
show
requests 6

echo
echo "== scale decode 4 -> 2, step 2: d-2, d-3 gone from the EndpointSlice"
T0=$(now_ms)
slice 2
wait_state "d-2, d-3 deleted" "d-0=UP d-1=UP"
show
requests 4

echo
now=$(pid_of_worker)
echo "HAProxy worker pid $WORKER before, $now after: $([[ $now == "$WORKER" ]] && echo "no reload, membership changed over the runtime API" || echo "RELOADED")"
echo "turnout log, discovered pools:"
grep -o '"pool":"llama_decode"[^}]*"message":"discovered pool"' "$WORK/turnout.log" | sed 's/,"message":"discovered pool"//; s/^/  /'
[[ $now == "$WORKER" ]]
