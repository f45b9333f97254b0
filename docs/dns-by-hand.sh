#!/usr/bin/env bash
# A manual check, not a test: two net-dns.yaml cases built by hand, without the harness, to
# compare torch's behaviour with the harness's verdicts (docs/network.md "DNS", "By hand").
#
#   sudo docs/dns-by-hand.sh [PYTHON]        # PYTHON: one with torch (default .venv/bin/python)
#   CASES=silent KEEP=/tmp/out sudo -E docs/dns-by-hand.sh   # one case; keep ranks' logs
#
# What it makes (all removed on exit by the trap, also on Ctrl-C or an error): three network
# namespaces dnsh-<pid>-{node0,node1,dns}, a bridge inside the dns namespace with a veth to each
# node (10.99.0.1, .2; the server .254), /etc/netns/<ns>/{hosts,nsswitch.conf,resolv.conf} for
# the nodes (loopback lines + this machine's name; "hosts: files dns"; the server only, search
# cluster.test, glibc's timeout:5 attempts:2), and dnsmasq in the dns namespace with a config
# like the harness's (no-resolv, no-hosts, no upstream, hostsdir, cache-size=0, no-negcache).
# Nothing is configured in the root namespace; no namespace has a route out.
#
# Cases:
#   late    MASTER_ADDR=master, timeout 10; master's record file is written 3 s after the
#           ranks start (net-dns.yaml late_record_in_time)
#   silent  MASTER_ADDR=10.99.0.1, timeout 5; dnsmasq frozen (SIGSTOP) after it answered once
#           (net-dns.yaml silent_resolver_ip_master)
# The ranks get what the harness gives them: MASTER_ADDR/PORT, RANK, WORLD_SIZE,
# GLOO_SOCKET_IFNAME=eth0 (gloo would otherwise take this machine's name, 127.0.0.1 here).
# Each rank prints one line: rank, outcome (ok or the exception's class), seconds from its
# start line (both imported torch) to the end of init_process_group + barrier + all_reduce (or to the exception), and the
# first line of the message; with "client-socket-warning" when its stderr has c10d's "The
# hostname of the client socket cannot be retrieved".
set -euo pipefail

PY=${1:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
CASES=${CASES:-"late silent"}
P=dnsh-$$
WORK=$(mktemp -d /tmp/dnsh.XXXXXX)
NETNS=("$P-node0" "$P-node1" "$P-dns")
DNSMASQ_PID=
RANK_PIDS=()

cleanup() {
    set +e
    for pid in "${RANK_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
    if [ -n "$DNSMASQ_PID" ]; then
        kill -CONT "$DNSMASQ_PID" 2>/dev/null; kill "$DNSMASQ_PID" 2>/dev/null
        wait "$DNSMASQ_PID" 2>/dev/null
    fi
    for ns in "${NETNS[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9
        ip netns del "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$WORK"/*.err "$WORK"/*.out "$WORK"/*.log "$KEEP"/ 2>/dev/null; fi
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

[ "$(id -u)" = 0 ] || { echo "run as root (ip netns)"; exit 2; }
command -v dnsmasq >/dev/null || { echo "dnsmasq is not installed (apt-get install dnsmasq-base)"; exit 2; }

# ---- the topology ------------------------------------------------------------------------------
for ns in "${NETNS[@]}"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
ip -n "$P-dns" link add br0 type bridge
ip -n "$P-dns" addr add 10.99.0.254/24 dev br0
ip -n "$P-dns" link set br0 up
i=1
for node in node0 node1; do
    ip link add "dnsh$$v$i" type veth peer name eth0 netns "$P-$node"
    ip link set "dnsh$$v$i" netns "$P-dns"
    ip -n "$P-dns" link set "dnsh$$v$i" master br0 up
    ip -n "$P-$node" addr add "10.99.0.$i/24" dev eth0
    ip -n "$P-$node" link set eth0 up
    mkdir -p "/etc/netns/$P-$node"
    printf '127.0.0.1\tlocalhost\n127.0.0.1\tlocalhost.localdomain\n::1\tlocalhost\n::1\tip6-localhost\n::1\tip6-loopback\n127.0.0.1\t%s\n' \
        "$(hostname)" > "/etc/netns/$P-$node/hosts"
    sed 's/^hosts:.*/hosts:          files dns/' /etc/nsswitch.conf > "/etc/netns/$P-$node/nsswitch.conf"
    printf 'nameserver 10.99.0.254\nsearch cluster.test\noptions timeout:5 attempts:2\n' \
        > "/etc/netns/$P-$node/resolv.conf"
    i=$((i + 1))
done

# ---- the name server ---------------------------------------------------------------------------
mkdir -p "$WORK/records"
cat > "$WORK/dnsmasq.conf" <<EOF
no-resolv
no-hosts
no-poll
keep-in-foreground
bind-interfaces
port=53
user=root
group=root
cache-size=0
no-negcache
log-queries
log-facility=-
pid-file=$WORK/dnsmasq.pid
hostsdir=$WORK/records
listen-address=10.99.0.254
local=/cluster.test/
local=/0.99.10.in-addr.arpa/
EOF
record() { printf '10.99.0.%s %s.cluster.test %s\n' "$2" "$1" "$1" > "$WORK/.$1"; mv "$WORK/.$1" "$WORK/records/$1"; }

start_dnsmasq() {
    ip netns exec "$P-dns" dnsmasq --conf-file="$WORK/dnsmasq.conf" 2>"$WORK/dnsmasq-$1.log" &
    DNSMASQ_PID=$!
    # ready: node1 gets an answer for its own name (never a sleep)
    for _ in $(seq 100); do
        if ip netns exec "$P-node1" getent ahostsv4 node1.cluster.test >/dev/null; then return; fi
        sleep 0.1
    done
    echo "dnsmasq did not answer"; exit 1
}
stop_dnsmasq() { kill -CONT "$DNSMASQ_PID"; kill "$DNSMASQ_PID"; wait "$DNSMASQ_PID" || true; DNSMASQ_PID=; }

RANK=$(cat <<'EOF'
import os, sys, time, json
t0 = time.monotonic()
from datetime import timedelta
import torch, torch.distributed as dist
# the start line, as the harness has it: every rank imported torch, then all go at once
open(os.environ["W"] + "/ready-" + os.environ["RANK"], "w").close()
while not os.path.exists(os.environ["W"] + "/go"):
    time.sleep(0.01)
t1 = time.monotonic()
try:
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ["T"])))
    dist.barrier(); t = torch.ones(1); dist.all_reduce(t); dist.destroy_process_group()
    out, msg = "ok", ""
except Exception as e:
    out, msg = type(e).__name__, str(e).splitlines()[0][:140]
print(json.dumps({"rank": int(os.environ["RANK"]), "outcome": out,
                  "init_s": round(time.monotonic() - t1, 2), "message": msg}), flush=True)
EOF
)

run_ranks() {   # $1 case, $2 MASTER_ADDR, $3 timeout, $4: a command run right after the ranks start
    local port=$((20000 + RANDOM % 20000)) r
    RANK_PIDS=()
    rm -f "$WORK"/ready-* "$WORK/go"
    for r in 0 1; do
        ip netns exec "$P-node$r" env MASTER_ADDR="$2" MASTER_PORT=$port RANK=$r WORLD_SIZE=2 \
            T="$3" W="$WORK" GLOO_SOCKET_IFNAME=eth0 TORCH_CPP_LOG_LEVEL=INFO "$PY" -c "$RANK" \
            >"$WORK/$1-$r.out" 2>"$WORK/$1-$r.err" &
        RANK_PIDS+=($!)
    done
    while [ ! -e "$WORK/ready-0" ] || [ ! -e "$WORK/ready-1" ]; do sleep 0.05; done
    touch "$WORK/go"
    eval "$4"
    for pid in "${RANK_PIDS[@]}"; do wait "$pid" || true; done
    RANK_PIDS=()
    for r in 0 1; do
        printf '%s rank %s: %s' "$1" "$r" "$(tail -1 "$WORK/$1-$r.out")"
        if grep -q "hostname of the client socket cannot be retrieved" "$WORK/$1-$r.err"; then
            printf ' client-socket-warning'
        fi
        echo
    done
}

for case in $CASES; do
    rm -f "$WORK"/records/*
    record node0 1; record node1 2
    case $case in
    late)
        start_dnsmasq late
        # master appears 3 s after the start line (the harness's heal_after: 3); this sleep IS
        # the situation (a record 3 s late), not a wait for something to happen
        run_ranks late master 10 "sleep 3; record master 1"
        stop_dnsmasq ;;
    silent)
        record master 1
        start_dnsmasq silent
        kill -STOP "$DNSMASQ_PID"
        run_ranks silent 10.99.0.1 5 ":"
        stop_dnsmasq ;;
    *) echo "unknown case $case"; exit 2 ;;
    esac
done
