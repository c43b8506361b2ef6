#!/usr/bin/env bash
# Stops the cluster hack/cluster/up.sh started and puts the machine back as up.sh found it:
# processes (by the pids up.sh recorded, and the containerd shims of its socket), containers,
# mounts, network namespaces, cgroups, iptables and nftables, the bridge and its routes,
# conntrack entries, sysctls, and the paths outside CLUSTER_DIR that were absent before. Then it
# checks each of them against what up.sh recorded and fails naming what differs.
#
# Usage: hack/cluster/down.sh
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=env.sh
source "$HERE/env.sh"
START_NS=$(date +%s%N)

if [[ ! -d "$STATE" ]]; then
  log "no cluster in $CLUSTER_DIR"
  exit 0
fi

alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }
stop_pid() { # pid: TERM, then KILL after 10 s
  local pid="$1" i
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 100; i++)); do alive "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  for ((i = 0; i < 50; i++)); do alive "$pid" || return 0; sleep 0.1; done
}
stop() { local f="$STATE/pids/$1"; [[ -f "$f" ]] && stop_pid "$(cat "$f")"; }

# 1. The node first, so nothing restarts what follows.
stop kubelet
stop kube-proxy

# 2. Every container and sandbox, through containerd while it runs.
CTR=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io)
if [[ -f "$STATE/pids/containerd" ]] && alive "$(cat "$STATE/pids/containerd")"; then
  for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do "${CTR[@]}" tasks delete -f "$t" >/dev/null 2>&1 && break; sleep 0.3; done
  done
  for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$c" >/dev/null 2>&1; done
fi

# 3. The control plane and containerd.
for p in containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$p"; done

# 4. Shims of this cluster's containerd outlive it by design; each names its socket.
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" || true); do stop_pid "$pid"; done
# Container processes left in the pod cgroups (a shim killed before its task).
if ! grep -q kubepods "$STATE/cgroups.before"; then
  for procs in $(find /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/kubepods -name cgroup.procs 2>/dev/null); do
    for pid in $(cat "$procs"); do kill -KILL "$pid" 2>/dev/null; done
  done
fi

# 5. Mounts: every one under CLUSTER_DIR (volumes, sandboxes' shm, overlay roots), deepest first,
#    and the network namespaces containerd made (bind mounts in /run/netns).
umount_under() {
  local m
  findmnt -rn -o TARGET | grep -E "^$1(/|$)" | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
}
umount_under "$CLUSTER_DIR"
for ns in /run/netns/cni-*; do
  [[ -e "$ns" ]] || continue
  umount "$ns" 2>/dev/null
  rm -f "$ns"
done

# 6. Cgroups the kubelet and runc made (depth first; a cgroup goes once its processes have).
while read -r root; do
  [[ -d "$root" ]] || continue
  find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null
done < <(for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
  [[ -d "$d" ]] && ! grep -qxF "$d" "$STATE/cgroups.before" && echo "$d"; done)

# 7. Packet filtering: nftables tables that were not there (the iptables-nft tables kube-proxy and
#    the kubelet filled included), then the tables that were, as they were.
nft list tables | while read -r _ fam name; do
  grep -qxF "table $fam $name" "$STATE/nft-tables.before" || nft delete table "$fam" "$name"
done
[[ -s "$STATE/iptables.before" ]] && iptables-restore <"$STATE/iptables.before"
[[ -s "$STATE/ip6tables.before" ]] && ip6tables-restore <"$STATE/ip6tables.before"

# 8. The bridge (its routes go with it), then the pods' veths if a namespace outlived its pod.
for veth in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  ip link delete "$veth" 2>/dev/null
done
ip link delete "$BRIDGE" 2>/dev/null
conntrack -D -s "$POD_CIDR" >/dev/null 2>&1
conntrack -D -d "$POD_CIDR" >/dev/null 2>&1
conntrack -D -d "$SERVICE_CIDR" >/dev/null 2>&1

# 9. Sysctls as found.
while IFS='=' read -r key value; do sysctl -qw "$key=$value" 2>/dev/null; done <"$STATE/sysctl.before"

# 10. Paths outside CLUSTER_DIR that were absent.
for p in "${OUTSIDE_PATHS[@]}"; do
  if [[ -e "$p" || -L "$p" ]] && ! grep -qxF "$p" "$STATE/paths.before"; then
    umount_under "$p"
    rm -rf --one-file-system "$p"
  fi
done

# 11. Check, then forget.
problems=()
for f in "$STATE"/pids/*; do
  pid="$(cat "$f")"
  alive "$pid" && problems+=("process $(basename "$f") ($pid) still runs")
done
pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" >/dev/null && problems+=("a containerd shim still runs")
ip link show "$BRIDGE" >/dev/null 2>&1 && problems+=("bridge $BRIDGE still exists")
findmnt -rn -o TARGET | grep -qE "^$CLUSTER_DIR(/|$)|^/run/netns/cni-" && problems+=("mounts left: $(findmnt -rn -o TARGET | grep -E "^$CLUSTER_DIR(/|$)|^/run/netns/cni-" | head -3 | tr '\n' ' ')")
diff -q <(iptables-save | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//') <(grep -v '^#' "$STATE/iptables.before" | sed 's/\[[0-9]*:[0-9]*\]//') >/dev/null ||
  problems+=("iptables differ from before")
diff -q <(nft list tables) "$STATE/nft-tables.before" >/dev/null || problems+=("nftables tables differ: $(nft list tables | tr '\n' ' ')")
while IFS='=' read -r key value; do
  [[ "$(sysctl -n "$key" 2>/dev/null)" == "$value" ]] || problems+=("sysctl $key is $(sysctl -n "$key"), was $value")
done <"$STATE/sysctl.before"
for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
  [[ -d "$d" ]] && ! grep -qxF "$d" "$STATE/cgroups.before" && problems+=("cgroup $d left")
done
for p in "${OUTSIDE_PATHS[@]}"; do
  [[ -e "$p" ]] && ! grep -qxF "$p" "$STATE/paths.before" && problems+=("$p left")
done
ms=$((($(date +%s%N) - START_NS) / 1000000))
if ((${#problems[@]})); then
  for p in "${problems[@]}"; do log "teardown left: $p"; done
  log "FAIL: the machine is not as up.sh found it (state kept in $STATE; run down.sh again)"
  exit 1
fi
rm -rf --one-file-system "$CLUSTER_DIR"
log "torn down in $((ms / 1000)).$((ms % 1000 / 100))s; the machine is as up.sh found it"
