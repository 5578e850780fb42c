#!/usr/bin/env bash
# Starts (and stops) a real multi-process Squall cluster on this machine: ZooKeeper (Debian's
# zookeeper package, unless ZOOKEEPER=host:port names a running one), two nimbuses (one leads,
# the other follows and takes over if it goes: nimbus HA), and two supervisors with their own
# ports and dirs, all from DIR/cluster.yaml (deploy/cluster.yaml plus `nimbus.seeds` naming both
# nimbuses, so supervisors and the CLI follow the leader) with per-process -c overrides.
# Everything lives under one directory (default: ./squall-cluster).
#
#   deploy/local-cluster.sh start [DIR]    # prints the nimbus address and how to submit
#   deploy/local-cluster.sh status [DIR]
#   deploy/local-cluster.sh stop [DIR]     # stops workers, supervisors, nimbus, ZooKeeper
#
# Environment: SQUALL (the squall binary; default: target/release/squall, else on PATH),
# ZOOKEEPER (an existing ensemble), ZK_PORT (default 2181), NIMBUS_PORT / NIMBUS2_PORT (default
# 8080 / NIMBUS_PORT+1), SLOTS_A / SLOTS_B (default 6700,6701 / 6710,6711).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
dir=$(mkdir -p "${2:-squall-cluster}" && cd "${2:-squall-cluster}" && pwd)
zk_port=${ZK_PORT:-2181}
nimbus_port=${NIMBUS_PORT:-8080}
nimbus2_port=${NIMBUS2_PORT:-$((nimbus_port + 1))}
daemons=(supervisor-a supervisor-b nimbus nimbus-2)
slots_a=${SLOTS_A:-6700,6701}
slots_b=${SLOTS_B:-6710,6711}

squall=${SQUALL:-}
if [[ -z $squall ]]; then
  if [[ -x $here/../target/release/squall ]]; then squall=$here/../target/release/squall
  elif command -v squall >/dev/null; then squall=$(command -v squall)
  else echo "no squall binary: build it (cargo build --release -p squall-cli) or set SQUALL" >&2; exit 1; fi
fi

running() { [[ -f $dir/$1.pid ]] && kill -0 "$(cat "$dir/$1.pid")" 2>/dev/null; }

# Starts a daemon in the background with its log and pid file.
spawn() {
  local name=$1; shift
  if running "$name"; then echo "$name is already running (pid $(cat "$dir/$name.pid"))"; return; fi
  setsid "$@" >>"$dir/$name.log" 2>&1 < /dev/null &
  echo $! >"$dir/$name.pid"
  echo "started $name (pid $!, log $dir/$name.log)"
}

# Waits until host:port accepts connections (bounded).
wait_port() {
  local what=$1 port=$2
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "$what did not open port $port; see its log in $dir" >&2
  exit 1
}

start_zookeeper() {
  if [[ -n ${ZOOKEEPER:-} ]]; then echo "using ZooKeeper at $ZOOKEEPER"; return; fi
  local jar=/usr/share/java/zookeeper.jar
  [[ -f $jar ]] || { echo "ZooKeeper is not installed: apt-get install zookeeper, or set ZOOKEEPER=host:port" >&2; exit 1; }
  mkdir -p "$dir/zookeeper/data"
  cat >"$dir/zookeeper/zoo.cfg" <<CFG
tickTime=2000
dataDir=$dir/zookeeper/data
clientPort=$zk_port
clientPortAddress=127.0.0.1
admin.enableServer=false
# Every supervisor, worker and spout task holds a session; one host runs them all here
# (ZooKeeper's default of 60 per client address is below a 2,000-supervisor simulation).
maxClientCnxns=0
4lw.commands.whitelist=ruok,stat,srvr,mntr
CFG
  local cp=$jar
  [[ -f /usr/share/java/slf4j-simple.jar ]] && cp=$cp:/usr/share/java/slf4j-simple.jar
  spawn zookeeper java -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zookeeper/zoo.cfg"
  wait_port ZooKeeper "$zk_port"
}

zk_connect() { echo "${ZOOKEEPER:-127.0.0.1:$zk_port}"; }

# The cluster's config: deploy/cluster.yaml and the seeds of this cluster's two nimbuses.
write_config() {
  { cat "$here/cluster.yaml"
    echo
    echo "# local-cluster.sh: both nimbuses; the CLI and supervisors follow the leader"
    echo "nimbus.seeds: [127.0.0.1:$nimbus_port, 127.0.0.1:$nimbus2_port]"
  } >"$dir/cluster.yaml"
}

common() {
  echo --config "$dir/cluster.yaml" --zookeeper "$(zk_connect)" \
    -c "nimbus.http.port=$nimbus_port" -c "nimbus.http.address=127.0.0.1:$nimbus_port" \
    -c "nimbus.http.host=127.0.0.1" -c "storm.local.hostname=127.0.0.1"
}

case $cmd in
  start)
    start_zookeeper
    write_config
    # shellcheck disable=SC2046
    spawn nimbus "$squall" nimbus $(common) -c "storm.local.dir=$dir/nimbus"
    # shellcheck disable=SC2046
    spawn nimbus-2 "$squall" nimbus $(common) -c "storm.local.dir=$dir/nimbus-2" \
      -c "nimbus.http.port=$nimbus2_port"
    wait_port nimbus "$nimbus_port"
    wait_port nimbus-2 "$nimbus2_port"
    # shellcheck disable=SC2046
    spawn supervisor-a "$squall" supervisor $(common) -c "storm.local.dir=$dir/supervisor-a" \
      -c "supervisor.slots.ports=[$slots_a]"
    # shellcheck disable=SC2046
    spawn supervisor-b "$squall" supervisor $(common) -c "storm.local.dir=$dir/supervisor-b" \
      -c "supervisor.slots.ports=[$slots_b]"
    echo
    echo "nimbus API: http://127.0.0.1:$nimbus_port/api/v1/cluster/summary (and :$nimbus2_port)"
    echo "submit:     $squall submit examples/wordcount.yaml --config $dir/cluster.yaml"
    echo "list:       $squall list --config $dir/cluster.yaml"
    echo "nimbuses:   $squall nimbus-summary --config $dir/cluster.yaml"
    echo "stop:       $0 stop $dir"
    ;;
  status)
    for name in zookeeper nimbus nimbus-2 supervisor-a supervisor-b; do
      if running "$name"; then echo "$name: running (pid $(cat "$dir/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  stop)
    # Supervisors first (SIGTERM: they stop, leaving workers to be stopped below), then their
    # workers (every process started under this dir), nimbus, ZooKeeper.
    for name in "${daemons[@]}"; do
      if running "$name"; then kill -TERM "$(cat "$dir/$name.pid")" && echo "stopping $name"; fi
    done
    pkill -TERM -f -- "--local-dir $dir/" 2>/dev/null || true
    for _ in $(seq 1 100); do
      alive=0
      for name in "${daemons[@]}"; do running "$name" && alive=1; done
      pgrep -f -- "--local-dir $dir/" >/dev/null && alive=1
      [[ $alive == 0 ]] && break
      sleep 0.1
    done
    pkill -KILL -f -- "--local-dir $dir/" 2>/dev/null || true
    for name in "${daemons[@]}"; do
      if running "$name"; then kill -KILL "$(cat "$dir/$name.pid")"; fi
      rm -f "$dir/$name.pid"
    done
    if running zookeeper; then
      kill -TERM "$(cat "$dir/zookeeper.pid")" && echo "stopping zookeeper"
      for _ in $(seq 1 100); do running zookeeper || break; sleep 0.1; done
      if running zookeeper; then kill -KILL "$(cat "$dir/zookeeper.pid")"; fi
    fi
    rm -f "$dir/zookeeper.pid"
    echo "stopped (state and logs stay in $dir)"
    ;;
  *)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac
