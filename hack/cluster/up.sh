#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on this machine, as root, without systemd or a container
# daemon of the machine's own: etcd and kube-apiserver from the envtest store,
# kube-controller-manager, kube-scheduler, kubelet and kube-proxy built into the same store
# (hack/setup-envtest.sh --with-node), Debian's containerd, runc and CNI plugins, and a bridge of
# its own. Image archives given as arguments are imported into containerd (no registry).
#
# Usage: hack/cluster/up.sh [IMAGE.tar...]    (prints the kubeconfig's path last)
# Stop it with hack/cluster/down.sh, which puts the machine back as up.sh found it.
#
# What this kind of machine needs (each found by a failing start):
# - CAP_SYS_RESOURCE is withheld, so runc cannot lower an OOM score: containerd runs with
#   restrict_oom_score_adj and the kubelet and kube-proxy with oomScoreAdj 0.
# - cgroup v1: the kubelet needs failCgroupV1 false and the cgroupfs driver.
# - Pods reach the API server through the kubernetes Service, which kube-proxy sends to the
#   advertised address: a loopback address is unreachable from a pod, so every listener is on
#   the bridge's address, and the bridge exists before anything starts.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=env.sh
source "$HERE/env.sh"
KUBE_BIN="${KUBE_BIN:-${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest/k8s/${ENVTEST_K8S_VERSION:-1.37.2}-linux-amd64}"
IMAGES=("$@")
START_NS=$(date +%s%N)
elapsed() { local ms=$((($(date +%s%N) - START_NS) / 1000000)); printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100)); }

# --- prerequisites: each missing one fails with what installs it -----------------------------
[[ $EUID -eq 0 ]] || die "run as root (a kubelet, containerd, a bridge and iptables rules)"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  [[ -x "$KUBE_BIN/$b" ]] || die "$KUBE_BIN/$b missing: hack/setup-envtest.sh --with-node builds it"
done
for c in containerd containerd-shim-runc-v2 runc ctr iptables iptables-save nft conntrack openssl ip; do
  command -v "$c" >/dev/null || die "$c missing: apt-get install containerd runc iptables nftables conntrack openssl iproute2"
done
for p in bridge host-local loopback portmap; do
  [[ -x /usr/lib/cni/$p ]] || die "/usr/lib/cni/$p missing: apt-get install containernetworking-plugins"
done
for img in "${IMAGES[@]}"; do [[ -f "$img" ]] || die "image archive $img missing (make images)"; done

if [[ -d "$STATE" ]]; then
  # Remains of a run that died are torn down; a cluster whose processes run is someone's.
  for f in "$STATE"/pids/*; do
    [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null &&
      die "a cluster is running in $CLUSTER_DIR ($(basename "$f") is pid $(cat "$f")): one at a time; hack/cluster/down.sh stops it"
  done
  log "the remains of an earlier cluster in $CLUSTER_DIR: tearing them down first"
  "$HERE/down.sh"
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  die "bridge $BRIDGE exists without $STATE: another cluster is up on this machine (one at a time)"
fi

mkdir -p "$STATE/pids" "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pki"
trap 'log "start failed after $(elapsed); logs in $CLUSTER_DIR/logs; run hack/cluster/down.sh"' ERR

# --- what down.sh puts back ----------------------------------------------------------------
for s in "${SYSCTLS[@]}"; do
  v="$(sysctl -n "$s" 2>/dev/null)" && printf '%s=%s\n' "$s" "$v"
done >"$STATE/sysctl.before"
iptables-save >"$STATE/iptables.before"
ip6tables-save >"$STATE/ip6tables.before"
nft list tables >"$STATE/nft-tables.before"
for p in "${OUTSIDE_PATHS[@]}"; do [[ -e "$p" || -L "$p" ]] && echo "$p"; done >"$STATE/paths.before" || true
for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do [[ -d "$d" ]] && echo "$d"; done >"$STATE/cgroups.before" || true

# --- network: the bridge first, then the routes, forwarding and rules ----------------------
ip link add "$BRIDGE" type bridge
echo "$BRIDGE" >"$STATE/bridge"
ip addr add "$NODE_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
sysctl -qw net.ipv4.ip_forward=1
# Pod traffic stays on the machine: between pods and to the node, never forwarded elsewhere.
iptables -N REDLINE-CLUSTER
iptables -A REDLINE-CLUSTER -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
iptables -A REDLINE-CLUSTER -i "$BRIDGE" -j DROP
iptables -A REDLINE-CLUSTER -o "$BRIDGE" -j DROP
iptables -I FORWARD 1 -j REDLINE-CLUSTER

# --- control plane -----------------------------------------------------------------------------
start() { # name command...: started in a session of its own, its pid recorded for down.sh
  local name="$1"; shift
  setsid "$@" >"$CLUSTER_DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/pids/$name"
}
wait_for() { # description timeout-seconds command...
  local what="$1" timeout="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what not within ${timeout}s (logs in $CLUSTER_DIR/logs)"
    sleep 0.3
  done
}

TOKEN="$(openssl rand -hex 24)"
printf '%s,redline-admin,redline-admin,"system:masters"\n' "$TOKEN" >"$CLUSTER_DIR/pki/tokens.csv"
openssl genrsa -out "$CLUSTER_DIR/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$CLUSTER_DIR/pki/sa.key" -pubout -out "$CLUSTER_DIR/pki/sa.pub" 2>/dev/null
# The aggregation layer (metrics-server's metrics.k8s.io, which the HPA reads): the API server
# calls an aggregated API server with a client certificate of a front-proxy CA, which that
# server trusts for the user the request names (extension-apiserver-authentication).
(
  cd "$CLUSTER_DIR/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt \
    -days 7 -subj /CN=redline-front-proxy-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
    -subj /CN=front-proxy-client 2>/dev/null
  openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
    -CAcreateserial -days 7 -extfile <(printf 'extendedKeyUsage=clientAuth\n') -out front-proxy-client.crt 2>/dev/null
)

start etcd "$KUBE_BIN/etcd" --name "$NODE_NAME" --data-dir "$CLUSTER_DIR/etcd" \
  --listen-client-urls "http://$NODE_IP:$ETCD_CLIENT_PORT" --advertise-client-urls "http://$NODE_IP:$ETCD_CLIENT_PORT" \
  --listen-peer-urls "http://$NODE_IP:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://$NODE_IP:$ETCD_PEER_PORT" \
  --initial-cluster "$NODE_NAME=http://$NODE_IP:$ETCD_PEER_PORT" --unsafe-no-fsync --quota-backend-bytes 1073741824
# The API server makes its own serving certificate (no --tls-cert-file) for the advertised
# address, the kubernetes Service's IP and its names, signed by a CA of its own that it writes
# beside it: that file is every client's CA, the pods' too (kube-root-ca.crt).
start kube-apiserver "$KUBE_BIN/kube-apiserver" \
  --etcd-servers "http://$NODE_IP:$ETCD_CLIENT_PORT" \
  --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port "$APISERVER_PORT" \
  --cert-dir "$CLUSTER_DIR/pki" --token-auth-file "$CLUSTER_DIR/pki/tokens.csv" \
  --authorization-mode Node,RBAC --allow-privileged=true \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$CLUSTER_DIR/pki/sa.pub" --service-account-signing-key-file "$CLUSTER_DIR/pki/sa.key" \
  --kubelet-preferred-address-types InternalIP --profiling=false \
  --requestheader-client-ca-file "$CLUSTER_DIR/pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$CLUSTER_DIR/pki/front-proxy-client.crt" --proxy-client-key-file "$CLUSTER_DIR/pki/front-proxy-client.key" \
  --enable-aggregator-routing=true
wait_for "the API server's certificate" 60 test -s "$CLUSTER_DIR/pki/apiserver.crt"
cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: redline
  cluster: {server: "https://$NODE_IP:$APISERVER_PORT", certificate-authority: "$CLUSTER_DIR/pki/apiserver.crt"}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: redline
  context: {cluster: redline, user: admin}
current-context: redline
EOF
KUBECTL=("$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE")
wait_for "the API server's readiness" 120 "${KUBECTL[@]}" get --raw /readyz
log "API server ready after $(elapsed)"

start kube-controller-manager "$KUBE_BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG_FILE" \
  --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
  --bind-address "$NODE_IP" --secure-port 10257 --leader-elect=false \
  --service-account-private-key-file "$CLUSTER_DIR/pki/sa.key" --root-ca-file "$CLUSTER_DIR/pki/apiserver.crt" \
  --service-cluster-ip-range "$SERVICE_CIDR" --use-service-account-credentials=false \
  --horizontal-pod-autoscaler-sync-period 5s
start kube-scheduler "$KUBE_BIN/kube-scheduler" --kubeconfig "$KUBECONFIG_FILE" \
  --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
  --bind-address "$NODE_IP" --secure-port 10259 --leader-elect=false

# --- containerd and the images ---------------------------------------------------------------
mkdir -p "$CLUSTER_DIR/containerd" "$CLUSTER_DIR/cni/net.d"
cat >"$CLUSTER_DIR/containerd/config.toml" <<EOF
version = 2
root = "$CLUSTER_DIR/containerd/root"
state = "$CLUSTER_DIR/containerd/state"
oom_score = 0
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CLUSTER_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "$NODE_IP"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CLUSTER_DIR/cni/net.d"
EOF
cat >"$CLUSTER_DIR/cni/net.d/10-redline.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "redline",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$CLUSTER_DIR/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
start containerd containerd --config "$CLUSTER_DIR/containerd/config.toml"
CTR=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io)
wait_for "containerd" 60 "${CTR[@]}" version

pause_tar="$CLUSTER_DIR/images/pause.tar"
if [[ ! -f "$pause_tar" ]]; then
  mkdir -p "$CLUSTER_DIR/images"
  (cd "$HERE/../images" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$CLUSTER_DIR/images/pause" ./pause &&
    go run . -out "$CLUSTER_DIR/images" "$PAUSE_IMAGE=$CLUSTER_DIR/images/pause" 2>/dev/null)
fi
for img in "$pause_tar" "${IMAGES[@]}"; do
  "${CTR[@]}" images import "$img" >/dev/null || die "importing $img"
done
log "containerd up, $((${#IMAGES[@]} + 1)) images imported after $(elapsed)"

# --- the node ----------------------------------------------------------------------------------
mkdir -p "$CLUSTER_DIR/kubelet"
cat >"$CLUSTER_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: 10248
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
oomScoreAdj: 0
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
podLogsDir: $CLUSTER_DIR/pod-logs
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
serializeImagePulls: false
EOF
start kubelet "$KUBE_BIN/kubelet" --config "$CLUSTER_DIR/kubelet/config.yaml" --kubeconfig "$KUBECONFIG_FILE" \
  --root-dir "$CLUSTER_DIR/kubelet" --cert-dir "$CLUSTER_DIR/kubelet/pki" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
cat >"$CLUSTER_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$KUBECONFIG_FILE"}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: "$NODE_IP:10256"
metricsBindAddress: "$NODE_IP:10249"
oomScoreAdj: 0
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {masqueradeAll: true, localhostNodePorts: false}
nodePortAddresses: ["$NODE_IP/32"]
EOF
start kube-proxy "$KUBE_BIN/kube-proxy" --config "$CLUSTER_DIR/kube-proxy.yaml"

wait_for "node $NODE_NAME registered" 120 "${KUBECTL[@]}" get node "$NODE_NAME"
"${KUBECTL[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s >/dev/null ||
  die "node $NODE_NAME not Ready (logs in $CLUSTER_DIR/logs)"
# Namespaces get their default ServiceAccount from the controller-manager; a pod created before
# it exists is refused.
wait_for "the default ServiceAccount" 60 "${KUBECTL[@]}" get serviceaccount default -n default
trap - ERR
log "node $NODE_NAME Ready after $(elapsed)"
echo "$KUBECONFIG_FILE"
