# Shared by scripts/run.sh (make run) and scripts/demo.sh (make demo):
# ports, the config that uses them, busy-port checks that name the owner,
# and the child processes every script stops on exit. Source it; it sets
# nothing else.
#
# Ports (environment or make variables; every one overridable). Unset, they
# are the embedded config's: mocks 8001-8004, HAProxy 8080, nginx 8081,
# turnout 9090, feedback 9514 (UDP).
#   PORT_BASE=N           moves all of them into N+1..N+99: mocks N+1..N+4,
#                         HAProxy N+80, nginx N+81, turnout N+90, feedback N+91 (UDP)
#   MOCK_PORT=8001        first of the 4 mock replicas (they use 4 consecutive ports)
#   HAPROXY_PORT=8080  NGINX_PORT=8081  TURNOUT_PORT=9090  FEEDBACK_PORT=9514
# e.g. make demo PORT_BASE=18000, or make demo HAPROXY_PORT=18080 TURNOUT_PORT=19090

if [[ -n ${PORT_BASE:-} ]]; then
  MOCK_PORT=${MOCK_PORT:-$((PORT_BASE + 1))}
  HAPROXY_PORT=${HAPROXY_PORT:-$((PORT_BASE + 80))}
  NGINX_PORT=${NGINX_PORT:-$((PORT_BASE + 81))}
  TURNOUT_PORT=${TURNOUT_PORT:-$((PORT_BASE + 90))}
  FEEDBACK_PORT=${FEEDBACK_PORT:-$((PORT_BASE + 91))}
fi
MOCK_PORT=${MOCK_PORT:-8001}
HAPROXY_PORT=${HAPROXY_PORT:-8080}
NGINX_PORT=${NGINX_PORT:-8081}
TURNOUT_PORT=${TURNOUT_PORT:-9090}
FEEDBACK_PORT=${FEEDBACK_PORT:-9514}
MOCK_PORTS=("$MOCK_PORT" $((MOCK_PORT + 1)) $((MOCK_PORT + 2)) $((MOCK_PORT + 3)))
TURNOUT=127.0.0.1:$TURNOUT_PORT

# port_owner PROTO PORT: "NAME (pid N)" of what holds PORT, "" if free: a
# listener, or (TCP) a client connection whose local port it is (the
# kernel's ephemeral range). ss names the owner (other users' processes
# only when run as root); without ss a connect probe tells busy from free.
port_owner() {
  local proto=$1 port=$2 line what=""
  if command -v ss >/dev/null; then
    local flag=-ltn
    [[ $proto == udp ]] && flag=-lun
    line=$(ss -H "${flag}p" "sport = :$port" 2>/dev/null | head -n 1)
    if [[ -z $line && $proto == tcp ]]; then
      # Only a connect()ed socket keeps a listener off its port (accepted
      # ones share the old listener's SO_REUSEADDR, TIME-WAIT ones do not
      # block), and the kernel picks its port in the ephemeral range.
      local lo=0 hi=-1
      read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null
      if ((port >= lo && port <= hi)); then
        line=$(ss -H -tnp state connected exclude time-wait "sport = :$port" 2>/dev/null | head -n 1)
        [[ -n $line ]] && what="a client connection (the kernel's ephemeral range $lo-$hi) of "
      fi
    fi
    [[ -z $line ]] && return 0
    if [[ $line =~ users:\(\(\"([^\"]+)\",pid=([0-9]+) ]]; then
      echo "$what${BASH_REMATCH[1]} (pid ${BASH_REMATCH[2]})"
    else
      echo "${what}another user's process (run ss -tnp as root to see it)"
    fi
  elif [[ $proto == tcp ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "an unknown process"
  fi
}

# check_ports PROTO:PORT:WHAT...: fail naming every busy port and its owner.
check_ports() {
  local busy=() spec proto port what owner
  for spec in "$@"; do
    IFS=: read -r proto port what <<<"$spec"
    owner=$(port_owner "$proto" "$port")
    [[ -n $owner ]] && busy+=("port $port ($what) is in use by $owner")
  done
  [[ ${#busy[@]} -eq 0 ]] && return 0
  for spec in "${busy[@]}"; do echo "$SCRIPT: $spec" >&2; done
  echo "$SCRIPT: stop it or choose other ports, e.g. make ${SCRIPT#make } PORT_BASE=18000 (or MOCK_PORT, HAPROXY_PORT, NGINX_PORT, TURNOUT_PORT, FEEDBACK_PORT)" >&2
  return 1
}

# write_config FILE: the embedded default config with this run's ports.
write_config() {
  sed -e "s/127\.0\.0\.1:9090/$TURNOUT/" -e "s/127\.0\.0\.1:9514/127.0.0.1:$FEEDBACK_PORT/" \
    -e "s/127\.0\.0\.1:8080/127.0.0.1:$HAPROXY_PORT/" -e "s/127\.0\.0\.1:8081/127.0.0.1:$NGINX_PORT/" \
    -e "s/127\.0\.0\.1:8001/127.0.0.1:${MOCK_PORTS[0]}/" -e "s/127\.0\.0\.1:8002/127.0.0.1:${MOCK_PORTS[1]}/" \
    -e "s/127\.0\.0\.1:8003/127.0.0.1:${MOCK_PORTS[2]}/" -e "s/127\.0\.0\.1:8004/127.0.0.1:${MOCK_PORTS[3]}/" \
    "$ROOT/internal/config/default_config.yaml" >"$1"
}

# Children: start_child NAME LOG CMD... runs CMD in the background and
# remembers it; stop_children ends them all (TERM, then KILL after 5 s).
CHILD_PIDS=()
CHILD_NAMES=()
CHILD_LOGS=()
start_child() {
  local name=$1 log=$2
  shift 2
  if [[ $log == - ]]; then "$@" & else "$@" >"$log" 2>&1 & fi
  CHILD_PIDS+=($!)
  CHILD_NAMES+=("$name")
  CHILD_LOGS+=("$log")
}
stop_children() {
  local pid i
  for pid in "${CHILD_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for ((i = 0; i < 50; i++)); do
    local alive=0
    for pid in "${CHILD_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for pid in "${CHILD_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${CHILD_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  CHILD_PIDS=()
}

# demo_end CODE: a demo's end once its workload is stopped: stop the
# children, show the tail of every log in $WORK when the demo failed (not
# when a signal ended it), and remove $WORK.
demo_end() {
  stop_children
  if [[ $1 -ne 0 && $1 -lt 128 ]]; then
    echo "demo failed; last log lines:" >&2
    for f in "$WORK"/*.log; do [[ -f $f ]] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
  fi
  rm -rf "$WORK"
}

# show_log NAME LOG: the tail of a child's log, for failures.
show_log() {
  [[ $2 != - && -f $2 ]] || return 0
  echo "---- $1 ($2), last lines:" >&2
  tail -n 20 "$2" >&2
}

# check_children: fail when a child has exited, showing its log.
check_children() {
  local i
  for i in "${!CHILD_PIDS[@]}"; do
    if ! kill -0 "${CHILD_PIDS[$i]}" 2>/dev/null; then
      echo "$SCRIPT: ${CHILD_NAMES[$i]} exited unexpectedly" >&2
      show_log "${CHILD_NAMES[$i]}" "${CHILD_LOGS[$i]}"
      return 1
    fi
  done
}

# wait_http NAME URL: poll until URL answers 2xx; fail early (with the log)
# when the child NAME has exited.
wait_http() {
  local name=$1 url=$2 i
  for ((i = 0; i < 150; i++)); do
    curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null && return 0
    check_children || return 1
    sleep 0.1
  done
  echo "$SCRIPT: $name did not answer $url within 15 s" >&2
  return 1
}

# supervise: the foreground loop of a script that only serves. Returns (1)
# when a child exits; returns (0) when the parent (make) is gone, even if it
# was killed with SIGKILL and could not pass a signal on. Signals interrupt
# the short "wait" at once, so the traps run without delay.
supervise() {
  local parent=$PPID
  while :; do
    check_children || return 1
    parent_alive "$parent" || return 0
    sleep 0.5 &
    wait $! 2>/dev/null || true
  done
}

# parent_alive PID: is PID still this script's parent? (A killed make may
# linger as a zombie, which kill -0 would still find; our own ppid changes.)
parent_alive() {
  local want=$1 stat
  if read -r stat </proc/$$/stat 2>/dev/null; then
    stat=${stat##*) }
    # shellcheck disable=SC2086  # split the fields: state ppid ...
    set -- $stat
    [[ $2 == "$want" ]]
    return
  fi
  kill -0 "$want" 2>/dev/null
}

# trap_signals: Ctrl-C (INT), TERM (kill, or make passing its own TERM on)
# and HUP stop every child, then exit 128+signal.
on_signal() {
  trap - INT TERM HUP
  stop_children
  exit "$1"
}
trap_signals() {
  trap 'on_signal 130' INT
  trap 'on_signal 143' TERM
  trap 'on_signal 129' HUP
}
