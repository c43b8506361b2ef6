# Settings shared by hack/cluster/up.sh and down.sh (sourced, not run).
#
# One cluster per machine: a bridge of its own (redline0, 10.213.0.1/24), a service range routed
# through it, every listener on the bridge's address (never loopback, where other suites start
# their own control planes on free ports), and every file under CLUSTER_DIR.

CLUSTER_DIR="${CLUSTER_DIR:-/tmp/redline-cluster}"
BRIDGE=redline0
NODE_IP=10.213.0.1
POD_CIDR=10.213.0.0/24
SERVICE_CIDR=10.214.0.0/24
NODE_NAME=redline-node
APISERVER_PORT=6443
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380
# The sandbox image's name: hack/images/pause, imported by up.sh.
PAUSE_IMAGE=redline.local/pause:test

CONTAINERD_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"
STATE="$CLUSTER_DIR/state"

# What the kubelet, kube-proxy and up.sh change in the kernel's settings; down.sh writes back
# what it found (the kubelet sets the first six when protectKernelDefaults is off).
SYSCTLS=(
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv4.conf.default.forwarding
  net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait
)

# Paths outside CLUSTER_DIR that containerd, the CNI plugins or the kubelet create whatever
# they are told; down.sh removes those that were absent before up.sh.
OUTSIDE_PATHS=(/var/lib/cni /var/log/containers /var/log/pods /run/netns /var/run/netns /etc/cni /opt/cni /run/containerd /var/lib/kubelet)

log() { printf '[cluster] %s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
