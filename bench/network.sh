#!/usr/bin/env bash
# What the network modes cost, side by side: from inside an instance, HTTP requests to a test
# server (a fresh connection each: set-up plus a tiny answer, the median of 50) and the download
# rate of 256 MiB, through `host`, `nat` (pasta) and `filtered` (ns-hpc's proxy); the wall time of
# a mode switch of a running instance (`instance update --network`, median of 5); and what a fresh
# sandbox per command pays for joining its instance's held namespace (20 commands, nat vs off).
# The test server runs in a network namespace made here (ip netns, a veth pair on
# 10.233.251.0/30): no packet leaves this machine.
# Usage: network.sh [NS_HPC_BINARY]. Needs root (ip netns), node and curl; nat also needs pasta.
set -euo pipefail

NSHPC="$(realpath "${1:-$(dirname "$0")/../build/ns-hpc}")"
if [[ $(id -u) -ne 0 ]]; then
  echo "bench network: skipped: the test server's network namespace needs root"
  exit 0
fi
for tool in node curl ip; do
  command -v "$tool" >/dev/null || { echo "bench network: skipped: $tool is not installed"; exit 0; }
done
NETNS="nshpc-bench-$$"
HOST_IF="nshb$$a"
WORLD_IF="nshb$$b"
SERVER=10.233.251.2
PORT=8080
WORK="$(mktemp -d /tmp/nshpc-bench-net-XXXXXX)"
chmod 755 "$WORK"
cat >"$WORK/config.toml" <<T
[namespace]
instances_dir = "$WORK/instances"
default_image = ""
[network]
allow = ["$SERVER:$PORT"]
T
ns() { "$NSHPC" -c "$WORK/config.toml" "$@"; }
server_pid=
cleanup() {
  for id in bench-host bench-nat bench-filtered bench-eph-nat bench-eph-off; do
    ns instance delete "$id" -f >/dev/null 2>&1 || true
  done
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null || true
  ip link del "$HOST_IF" 2>/dev/null || true
  ip netns del "$NETNS" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ip netns add "$NETNS"
ip link add "$HOST_IF" type veth peer name "$WORLD_IF"
ip link set "$WORLD_IF" netns "$NETNS"
ip addr add 10.233.251.1/30 dev "$HOST_IF"
ip link set "$HOST_IF" up
ip -n "$NETNS" addr add "$SERVER/30" dev "$WORLD_IF"
ip -n "$NETNS" link set "$WORLD_IF" up
ip -n "$NETNS" link set lo up
ip -n "$NETNS" route add default via 10.233.251.1
cat >"$WORK/server.js" <<'JS'
const http = require('http');
const chunk = Buffer.alloc(1 << 20);
http.createServer((req, res) => {
  if (req.url === '/big') {
    res.writeHead(200, {'Content-Length': 256 * chunk.length});
    let left = 256;
    const more = () => { while (left > 0) { left--; if (!res.write(chunk)) return res.once('drain', more); } res.end(); };
    more();
  } else {
    res.writeHead(200, {'Content-Length': 3, 'Connection': 'close'});
    res.end('ok\n');
  }
}).listen(Number(process.argv[3]), process.argv[2]);
JS
ip netns exec "$NETNS" node "$WORK/server.js" "$SERVER" "$PORT" &
server_pid=$!
for _ in $(seq 50); do curl -s -m 1 -o /dev/null "http://$SERVER:$PORT/" && break; sleep 0.1; done

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

modes=(host filtered)
if command -v pasta >/dev/null && [[ -c /dev/net/tun ]]; then
  modes=(host nat filtered)
else
  echo "bench network: nat left out: it needs pasta (package passt) and /dev/net/tun"
fi

printf '%-10s %22s %18s\n' mode "request, fresh conn." "256 MiB download"
for mode in "${modes[@]}"; do
  ns instance create "bench-$mode" --network "$mode" --persistent >/dev/null
  ns bwrap "bench-$mode" -- true
  request=$(ns bwrap "bench-$mode" -- /bin/sh -c \
    "for i in \$(seq 50); do curl -s -o /dev/null -w '%{time_total}\n' http://$SERVER:$PORT/small; done" |
    awk '{printf "%.3f\n", $1 * 1000}' | median)
  rate=$(ns bwrap "bench-$mode" -- curl -s -o /dev/null -w '%{speed_download}' "http://$SERVER:$PORT/big")
  printf '%-10s %19s ms %13s MB/s\n' "$mode" "$request" "$(awk -v r="$rate" 'BEGIN {printf "%.0f", r / 1e6}')"
done

for mode in "${modes[@]}"; do
  [[ $mode == host ]] && continue
  times=()
  for _ in 1 2 3 4 5; do
    t=$(date +%s%N); ns instance update "bench-$mode" --network off >/dev/null; times+=("$(ms "$t")")
    t=$(date +%s%N); ns instance update "bench-$mode" --network "$mode" >/dev/null; times+=("$(ms "$t")")
  done
  echo "switch $mode <-> off of a running instance: median $(printf '%s\n' "${times[@]}" | median) ms (the CLI's whole run)"
done

eph_mode=${modes[1]}
ns instance create bench-eph-off --network off --no-persistent >/dev/null
ns instance create bench-eph-nat --network "$eph_mode" --no-persistent >/dev/null
for id in bench-eph-off bench-eph-nat; do
  ns bwrap "$id" -- true
  t=$(date +%s%N)
  for _ in $(seq 20); do ns bwrap "$id" -- true; done
  echo "fresh sandbox per command, $( [[ $id == bench-eph-off ]] && echo off || echo "$eph_mode (joins the held namespace)"): $(( $(ms "$t") / 20 )) ms a command"
done
