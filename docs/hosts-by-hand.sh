#!/usr/bin/env bash
# A hand-made launch, without the harness, of two cases of scenarios/net-hosts-as-machines.yaml,
# to check that the harness's verdicts agree with what plain tools give (docs/network.md,
# "Hosts as whole machines"). Run as root from the repository root with the venv made:
#   sudo docs/hosts-by-hand.sh [own|shared|syn]
# own:    two namespaces with names of their own (unshare --uts), each name on its link address
#         in its hosts file, GLOO_SOCKET_IFNAME unset: the 2-rank job is ok.
# shared: the same with the machine's name, on 127.0.0.1 in both hosts files (as plain
#         namespaces have it): gloo advertises 127.0.0.1 and the mesh fails.
# syn:    names of their own, net.ipv4.tcp_syn_retries=1 in both, every port but the store's
#         dropped on node0: rank 1 gives up its mesh connect after a few seconds.
# Everything it makes is removed on exit (trap), also on Ctrl-C.
set -euo pipefail
mode=${1:-own}
py=${PYTHON:-.venv/bin/python}
id=hb$$
a=$id-a; b=$id-b; sw=$id-sw
port=$((20000 + RANDOM % 5000))
pins=/run/$id
cleanup() {
  set +e
  for p in "$pins"/*; do [ -e "$p" ] && umount -l "$p"; done
  rm -rf "$pins"
  for ns in "$a" "$b" "$sw"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
}
trap cleanup EXIT INT TERM
for ns in "$a" "$b" "$sw"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up
i=1
for ns in "$a" "$b"; do
  ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$sw"
  ip -n "$sw" link set "p$i" master br0 up
  ip -n "$ns" addr add "10.213.250.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  i=$((i + 1))
done
mkdir -p "$pins"
names="127.0.0.1 localhost"
for i in 1 2; do
  ns=$([ $i = 1 ] && echo "$a" || echo "$b")
  mkdir -p "/etc/netns/$ns"
  printf 'hosts: files\n' > "/etc/netns/$ns/nsswitch.conf"
  printf 'nameserver 127.0.0.1\n' > "/etc/netns/$ns/resolv.conf"
  if [ "$mode" = shared ]; then
    printf '%s\n127.0.0.1 %s\n' "$names" "$(hostname)" > "/etc/netns/$ns/hosts"
  else
    printf '%s\n10.213.250.1 node0\n10.213.250.2 node1\n' "$names" > "/etc/netns/$ns/hosts"
    touch "$pins/$ns"
    unshare --uts="$pins/$ns" hostname "node$((i - 1))"
  fi
  if [ "$mode" = syn ]; then
    ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv4/tcp_syn_retries'
  fi
done
if [ "$mode" = syn ]; then
  ip netns exec "$a" nft add table inet hb
  ip netns exec "$a" nft add chain inet hb input '{ type filter hook input priority 0; policy accept; }'
  ip netns exec "$a" nft add rule inet hb input ct state new tcp dport != "$port" drop
fi
rank() {   # rank NUMBER NAMESPACE
  local pre=(ip netns exec "$2")
  [ "$mode" != shared ] && pre=(nsenter --uts="$pins/$2" "${pre[@]}")
  env -u GLOO_SOCKET_IFNAME MASTER_ADDR=10.213.250.1 MASTER_PORT=$port RANK=$1 WORLD_SIZE=2 \
    "${pre[@]}" "$py" -c '
import socket, sys, time, datetime, torch.distributed as dist
t = time.monotonic()
try:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    dist.barrier(); dist.all_reduce(__import__("torch").ones(1))
    print(f"rank {dist.get_rank()} on {socket.gethostname()}: ok {time.monotonic() - t:.1f} s")
except Exception as e:
    print(f"rank on {socket.gethostname()}: {type(e).__name__} {time.monotonic() - t:.1f} s: "
          f"{str(e).splitlines()[0][:160]}")
' &
}
rank 0 "$a"; rank 1 "$b"; wait
