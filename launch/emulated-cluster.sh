#!/usr/bin/env bash
# Runs COMMAND on N emulated nodes of this machine: each node is a network namespace, joined
# to the others through a bridge by a veth pair shaped to the link's rate with tc.
#
#   launch/emulated-cluster.sh --nodes N --ranks-per-node R --link-gbit G [--latency-us L] -- COMMAND...
#
# COMMAND runs R times in each node (an MPMD job of the venv's mpiexec) and talks to the
# other nodes through the shaped links only: MPICH is told to use its network module between
# all ranks. Each rank finds its node's index in PYDTNN_LITE_NODE (the hierarchical strategy
# and the performance model group ranks by it) and the link's rate in PYDTNN_LITE_LINK_GBIT.
# Everything is removed on exit, Ctrl-C and errors included; namespaces left by a killed run
# are removed before a new cluster starts. docs/emulated-cluster.md has the details.
set -euo pipefail

PROGRAM=emulated-cluster
PREFIX=pdtl                  # the namespaces: pdtl-switch (the bridge) and pdtl-node0, pdtl-node1, ...
SWITCH=$PREFIX-switch
LOCK=/run/lock/pydtnn-lite-emulated-cluster.lock
NODE_DEVICE=emu0             # every node's end of its link
SUBNET=10.213.0              # node i is $SUBNET.(i+1)

die() { echo "$PROGRAM: error: $*" >&2; exit 2; }
usage() { sed -n '4p' "$0" | sed 's/^#   /usage: /'; }

nodes="" ranks_per_node="" link_gbit="" latency_us=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=${2-}; shift 2 || die "--nodes needs a value" ;;
    --ranks-per-node) ranks_per_node=${2-}; shift 2 || die "--ranks-per-node needs a value" ;;
    --link-gbit) link_gbit=${2-}; shift 2 || die "--link-gbit needs a value" ;;
    --latency-us) latency_us=${2-}; shift 2 || die "--latency-us needs a value" ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1': $(usage)" ;;
  esac
done
[ -n "$nodes" ] && [ -n "$ranks_per_node" ] && [ -n "$link_gbit" ] || die "--nodes, --ranks-per-node and --link-gbit are required: $(usage)"
[ $# -gt 0 ] || die "no command to run: put it after '--', e.g. -- .venv/bin/python -m pydtnn_lite.train"
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 250 ] || die "--nodes $nodes: give a whole number from 1 to 250"
[[ "$ranks_per_node" =~ ^[0-9]+$ ]] && [ "$ranks_per_node" -ge 1 ] || die "--ranks-per-node $ranks_per_node: give a whole number of at least 1"
[[ "$link_gbit" =~ ^[0-9]*\.?[0-9]+$ && "$link_gbit" =~ [1-9] ]] || die "--link-gbit $link_gbit: give a rate in Gbit/s above 0, e.g. 1 or 2.5"
[ -z "$latency_us" ] || [[ "$latency_us" =~ ^[0-9]+$ ]] || die "--latency-us $latency_us: give a whole number of microseconds"

[ "$(id -u)" = 0 ] || die "network namespaces and tc need root: run it as root (e.g. with sudo)"
command -v ip >/dev/null && command -v tc >/dev/null || die "ip and tc are missing: install iproute2"
command -v flock >/dev/null || die "flock is missing: install util-linux"
mpiexec=${MPIEXEC:-${VENV:-.venv}/bin/mpiexec}
[ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec) || die "no mpiexec at ${VENV:-.venv}/bin/mpiexec nor on PATH: set VENV to the environment holding the mpich wheel, or MPIEXEC"

# One cluster at a time: the namespaces' names are the machine's. The lock dies with its holder.
mkdir -p "$(dirname "$LOCK")"
exec {lock_fd}<>"$LOCK"
flock -n "$lock_fd" || die "another emulated cluster is running (pid $(cat "$LOCK" 2>/dev/null || echo unknown)): wait for it to end"
echo $$ >"$LOCK"

our_namespaces() { ip netns list | awk -v prefix="$PREFIX-" 'index($1, prefix) == 1 { print $1 }'; }

remove_namespaces() {  # ends what still runs inside our namespaces (our ranks), then removes them
  local namespace pid
  for namespace in $(our_namespaces); do
    for pid in $(ip netns pids "$namespace" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$namespace" 2>/dev/null || true
  done
}

leftovers=$(our_namespaces | wc -l)
if [ "$leftovers" -gt 0 ]; then
  remove_namespaces
  echo "$PROGRAM: removed $leftovers namespace(s) left by a killed run" >&2
fi

job_pid=""
cleanup() {
  trap - EXIT INT TERM HUP
  if [ -n "$job_pid" ]; then
    kill -TERM "$job_pid" 2>/dev/null || true
    # A few seconds to end on its own (a trainer checkpoints on SIGTERM), then the namespaces' processes are killed.
    for _ in $(seq 50); do kill -0 "$job_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$job_pid" 2>/dev/null || true
  fi
  remove_namespaces
  [ -z "$job_pid" ] || wait "$job_pid" 2>/dev/null || true
  : >"$LOCK"
}
on_signal() { cleanup; exit $((128 + $1)); }
trap cleanup EXIT
trap 'on_signal 2' INT
trap 'on_signal 15' TERM
trap 'on_signal 1' HUP

# tc's burst: a millisecond of the link's rate, and never below 64 KiB (one GSO packet of veth)
burst_bytes=$(awk "BEGIN { b = $link_gbit * 1e9 / 8 / 1000; print int(b < 65536 ? 65536 : b) }")
shape() {  # shape NAMESPACE DEVICE: the device's egress at the link's rate, half the latency on it
  local namespace=$1 device=$2
  if [ -n "$latency_us" ] && [ "$latency_us" -gt 0 ]; then
    ip netns exec "$namespace" tc qdisc add dev "$device" root handle 1: tbf rate "${link_gbit}gbit" \
      burst "$burst_bytes" latency 50ms
    ip netns exec "$namespace" tc qdisc add dev "$device" parent 1:1 handle 10: netem delay "$((latency_us / 2))us" \
      2>/dev/null || die "--latency-us needs tc's netem qdisc, which this kernel lacks: leave --latency-us out"
  else
    ip netns exec "$namespace" tc qdisc add dev "$device" root tbf rate "${link_gbit}gbit" burst "$burst_bytes" latency 50ms
  fi
}

ip netns add "$SWITCH"
ip -n "$SWITCH" link add br0 type bridge
ip -n "$SWITCH" link set br0 up
for ((node = 0; node < nodes; node++)); do
  namespace=$PREFIX-node$node
  ip netns add "$namespace"
  ip -n "$namespace" link set lo up
  ip -n "$SWITCH" link add "port$node" type veth peer name "$NODE_DEVICE" netns "$namespace"
  ip -n "$SWITCH" link set "port$node" master br0 up
  ip -n "$namespace" addr add "$SUBNET.$((node + 1))/24" dev "$NODE_DEVICE"
  ip -n "$namespace" link set "$NODE_DEVICE" up
  shape "$namespace" "$NODE_DEVICE"
  shape "$SWITCH" "port$node"
done

# MPMD: one program per node, each entered into its namespace, MPICH's network module between all ranks.
job=()
for ((node = 0; node < nodes; node++)); do
  [ "$node" -eq 0 ] || job+=(:)
  job+=(-n "$ranks_per_node" ip netns exec "$PREFIX-node$node" env PYDTNN_LITE_NODE="$node"
        PYDTNN_LITE_LINK_GBIT="$link_gbit" FI_TCP_IFACE="$NODE_DEVICE" "$@")
done
echo "$PROGRAM: $nodes node(s) x $ranks_per_node rank(s), links of $link_gbit Gbit/s${latency_us:+ and $latency_us us}" >&2
set +e
# The job does not inherit the lock: MPICH's proxies can outlive the launcher by a moment,
# and would hold it against the next cluster.
MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp "$mpiexec" "${job[@]}" {lock_fd}>&- &
job_pid=$!
wait "$job_pid"
status=$?
job_pid=""
exit "$status"
