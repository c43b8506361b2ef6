// Package contract holds the sidecar's interface as the pod injector must use it: pod
// annotations, the sidecar's flags, environment variables, mount paths and ports.
//
// It imports nothing, so the sidecar binary can use it without pulling in Kubernetes client
// libraries. A change here is a change of the injector/sidecar interface: both sides move
// together.
package contract

// Pod annotations read by the injector (users put them on a Deployment's pod template).
const (
	// AnnotationInject opts a pod in when its value is "true", and out of a namespace that
	// opted in (NamespaceLabelInjection) when "false". LabelInject, a pod label of the same
	// name and values, does the same.
	AnnotationInject = "redline.dev/inject"
	// LabelInject is AnnotationInject as a pod label, which selectors (a PodMonitor, a
	// NetworkPolicy) can also see.
	LabelInject = "redline.dev/inject"
	// NamespaceLabelInjection set to NamespaceInjectionEnabled on a namespace opts in every pod
	// created in it, but those that set AnnotationInject or LabelInject to "false".
	NamespaceLabelInjection   = "redline.dev/injection"
	NamespaceInjectionEnabled = "enabled"
	// AnnotationUpstreamPort is the application's port the sidecar forwards to (1-65535).
	// Required: without a valid one the pod is admitted unchanged, with a warning.
	AnnotationUpstreamPort = "redline.dev/upstream-port"
	// AnnotationUpstreamProtocol is how the sidecar speaks to the application: one of
	// UpstreamProtocols (default HTTP1). The proxy face accepts HTTP/1.1 and h2c whatever it
	// is; a gRPC server's plaintext port wants H2C, an application that serves TLS HTTPS.
	AnnotationUpstreamProtocol = "redline.dev/upstream-protocol"
	// AnnotationListenPort is the port the sidecar's proxy listens on; the Service should target
	// it. Defaults to DefaultListenPort; must differ from the upstream port.
	AnnotationListenPort = "redline.dev/listen-port"
	// AnnotationFailureMode overrides the policies' failure mode for this pod: one of
	// FailureModes.
	AnnotationFailureMode = "redline.dev/failure-mode"
	// AnnotationSidecarCPU sets the sidecar's CPU request (a resource quantity such as "100m").
	AnnotationSidecarCPU = "redline.dev/sidecar-cpu"
	// AnnotationSidecarMemory sets the sidecar's memory request and limit (e.g. "48Mi").
	AnnotationSidecarMemory = "redline.dev/sidecar-memory"
	// AnnotationSidecarMaxProcs sets how many CPUs the sidecar runs Go code on at once
	// (GOMAXPROCS, 1-64; default 1). Raise it for a sidecar answering heavy /v1/check or Envoy
	// traffic on dedicated cores.
	AnnotationSidecarMaxProcs = "redline.dev/sidecar-max-procs"
	// AnnotationExposeDecisionAPI set to "true" serves the decision faces (POST /v1/check on
	// CheckPort and the Envoy rate limit service on GRPCPort) on the pod network, for a gateway
	// outside the pod. Without it they listen on loopback only: anything that can reach the
	// pod could otherwise spend any client's quota (ask with the victim's key until refused).
	AnnotationExposeDecisionAPI = "redline.dev/expose-decision-api"
	// AnnotationRedisPoolSize sets the sidecar's Redis pool: connections per Redis node,
	// MinRedisPoolSize to MaxRedisPoolSize. Without it the manager sizes the pool from the
	// connection budget (internal/connbudget), between MinRedisPoolSize and
	// DefaultRedisPoolSize, in the namespace's ConfigMap the sidecar reads it from
	// (EnvBudgetRedisPoolSize). The controller counts it, times the workload's maxReplicas, against
	// Redis's maxclients.
	AnnotationRedisPoolSize = "redline.dev/redis-pool-size"
	// AnnotationTrustedHops is how many proxies in front of the pod (a cloud load balancer,
	// an ingress controller) append to X-Forwarded-For and are trusted to: the ForwardedFor
	// key part is then the TrustedHops-th entry from the right (FlagTrustedHops), 0 to
	// MaxTrustedHops. Without it, the manager's --sidecar-trusted-hops, 0 by default: the
	// connection's peer.
	AnnotationTrustedHops = "redline.dev/trusted-hops"
	// AnnotationDecisionLog turns on the sidecar's decision log (FlagDecisionLog): "refused"
	// logs each refusal, "all" every decision, "off" (the default) nothing; sampled and
	// rate-bounded by the sidecar's defaults.
	AnnotationDecisionLog = "redline.dev/decision-log"
	// AnnotationInjected is written by the injector and records what it injected. A pod that
	// carries it is never injected again.
	AnnotationInjected = "redline.dev/injected"
)

// The sidecar's Redis pool, per Redis node (--redis-pool-size).
const (
	// DefaultRedisPoolSize is the pool of a sidecar whose pod does not set
	// AnnotationRedisPoolSize.
	DefaultRedisPoolSize = 16
	// MinRedisPoolSize keeps batching and heartbeats working beside a blocked call.
	MinRedisPoolSize = 2
	// MaxRedisPoolSize bounds what one pod may ask for.
	MaxRedisPoolSize = 1024
	// DefaultRedisIdleTimeoutSeconds is how long a sidecar's Redis connection may stay idle
	// before it closes (--redis-idle-timeout): at rest a sidecar holds the one its heartbeat
	// uses.
	DefaultRedisIdleTimeoutSeconds = 60
	// RedisClientName is the name every sidecar connection gives itself (CLIENT SETNAME):
	// CLIENT LIST tells sidecars' connections from others' by it.
	RedisClientName = "redline-sidecar"
)

// Defaults and bounds of the sidecar's other settings, which the manager's --sidecar-* flags
// may change for every injected pod.
const (
	// DefaultMaxProcs is the sidecar's GOMAXPROCS (--max-procs); MaxMaxProcs bounds what a pod
	// or the manager may ask for.
	DefaultMaxProcs = 1
	MaxMaxProcs     = 64
	// DefaultLeaseKeys is how many keys may hold a lease at once (--lease-keys); MaxLeaseKeys
	// bounds it, because the table and its warm-key hashes are sized from it at start.
	DefaultLeaseKeys = 16384
	MaxLeaseKeys     = 1 << 20
	// DefaultShareKeys is how many keys' shares a sidecar keeps to restore what Redis loses in
	// a failover (--share-keys); MaxShareKeys bounds it.
	DefaultShareKeys = 65536
	MaxShareKeys     = 1 << 21
	// LeaseKeyBytes is what one key of the lease table may take at its worst: about 400 bytes,
	// twice that with the garbage collector's headroom.
	LeaseKeyBytes = 800
	// DefaultLeaseHorizonSeconds is --lease-horizon's default; 0 turns leases off.
	DefaultLeaseHorizonSeconds = 2
	// DefaultRedisTimeoutMillis is --redis-timeout's default: Redis's read, write and
	// free-connection wait, past which the failure mode answers.
	DefaultRedisTimeoutMillis = 50
	// MaxTrustedHops bounds --trusted-hops: no real chain of proxies is longer, and a value
	// beyond the real chain lets every client choose its own key.
	MaxTrustedHops = 16
)

// Failure modes accepted by AnnotationFailureMode and the sidecar's --failure-mode flag.
const (
	FailureModeOpen          = "Open"
	FailureModeClosed        = "Closed"
	FailureModeLocalFallback = "LocalFallback"
)

// Upstream protocols accepted by AnnotationUpstreamProtocol and the sidecar's
// --upstream-protocol flag.
const (
	// UpstreamProtocolHTTP1 is HTTP/1.1 over cleartext, upgrades (WebSocket) included.
	UpstreamProtocolHTTP1 = "HTTP1"
	// UpstreamProtocolH2C is HTTP/2 over cleartext with prior knowledge (a gRPC server's
	// plaintext port); upgrade requests still go over HTTP/1.1.
	UpstreamProtocolH2C = "H2C"
	// UpstreamProtocolHTTPS is TLS, HTTP/2 when the application offers it, else HTTP/1.1.
	UpstreamProtocolHTTPS = "HTTPS"
)

// UpstreamProtocols lists the accepted upstream protocols.
var UpstreamProtocols = []string{UpstreamProtocolHTTP1, UpstreamProtocolH2C, UpstreamProtocolHTTPS}

// FailureModes lists the accepted failure modes.
var FailureModes = []string{FailureModeOpen, FailureModeClosed, FailureModeLocalFallback}

// The sidecar container.
const (
	// ContainerName is the name of the injected container.
	ContainerName = "redline-sidecar"
	// ListenPortName names the proxy's containerPort.
	ListenPortName = "redline"
	// AdminPortName names the admin port's containerPort (health and metrics).
	AdminPortName = "redline-admin"
	// DefaultListenPort is the proxy's port when the pod does not set AnnotationListenPort.
	DefaultListenPort = 8000
	// AdminPort serves HealthzPath, ReadyzPath and MetricsPath on the pod network, for the
	// kubelet and Prometheus.
	AdminPort = 9091
	// GRPCPortName names the containerPort of Envoy's rate limit service, so that a Service
	// can route a gateway's ShouldRateLimit calls to the sidecars.
	GRPCPortName = "redline-grpc"
	// GRPCPort serves envoy.service.ratelimit.v3.RateLimitService, on LoopbackHost unless the
	// pod sets AnnotationExposeDecisionAPI.
	GRPCPort = 9092
	// CheckPortName names the containerPort of POST /v1/check when it is exposed.
	CheckPortName = "redline-check"
	// CheckPort serves POST /v1/check, on LoopbackHost unless the pod sets
	// AnnotationExposeDecisionAPI.
	CheckPort = 9093
	// LoopbackHost is where the decision faces listen by default: reachable from the pod's
	// own containers (an Envoy, the application) only.
	LoopbackHost = "127.0.0.1"
	// HealthzPath answers the liveness probe.
	HealthzPath = "/healthz"
	// ReadyzPath answers the readiness probe.
	ReadyzPath = "/readyz"
	// MetricsPath serves Prometheus metrics.
	MetricsPath = "/metrics"
	// UpstreamHost is where the application is reached from the sidecar.
	UpstreamHost = "127.0.0.1"
	// RunAsUser is the sidecar's user and group id (non-root).
	RunAsUser = 65532
)

// Command-line flags of the sidecar, as the injector passes them ("--name=value").
const (
	FlagListen   = "listen"   // ":<listen port>"
	FlagUpstream = "upstream" // "127.0.0.1:<upstream port>"
	// FlagUpstreamProtocol is passed when the pod sets AnnotationUpstreamProtocol.
	FlagUpstreamProtocol = "upstream-protocol"
	FlagAdminListen      = "admin-listen" // ":9091"
	FlagGRPCListen       = "grpc-listen"  // "127.0.0.1:9092", or ":9092" when exposed
	FlagCheckListen      = "check-listen" // "127.0.0.1:9093", or ":9093" when exposed
	FlagConfigDir        = "config-dir"   // PoliciesDir
	FlagPodLabels        = "pod-labels"   // PodLabelsFile
	FlagFailureMode      = "failure-mode" // when AnnotationFailureMode or the manager's --sidecar-failure-mode is set
	FlagMaxProcs         = "max-procs"    // when AnnotationSidecarMaxProcs or the manager's --sidecar-max-procs is set
	FlagTrustedHops      = "trusted-hops" // when AnnotationTrustedHops or the manager's --sidecar-trusted-hops is above 0
	FlagDecisionLog      = "decision-log" // when AnnotationDecisionLog is set to another mode than DecisionLogOff
	// FlagLeaseKeys, FlagLeaseHorizon and FlagRedisTimeout are passed when the manager's
	// --sidecar-lease-keys, --sidecar-lease-horizon and --sidecar-redis-timeout are set.
	FlagLeaseKeys    = "lease-keys"
	FlagLeaseHorizon = "lease-horizon"
	FlagRedisTimeout = "redis-timeout"
	// FlagRedisCredentialsDir is the mounted credentials Secret (RedisCredentialsDir): the
	// sidecar reads RedisUsernameKey and RedisSecretKey in it at every new Redis connection.
	FlagRedisCredentialsDir = "redis-credentials-dir"
	// FlagRedisPoolSize is passed when AnnotationRedisPoolSize or the manager's
	// --sidecar-redis-pool-size is set; without it the sidecar uses DefaultRedisPoolSize. The
	// connection budget's pool comes through EnvBudgetRedisPoolSize, which wins over the
	// manager's default.
	FlagRedisPoolSize = "redis-pool-size"
	// FlagFallbackReplicas is the replica count LocalFallback divides a limit by while the
	// sidecar has heard no heartbeat of the policy's group (a pod started during a Redis
	// outage): the workload's largest replica count, its HPA's maxReplicas. 0: 1.
	FlagFallbackReplicas = "fallback-replicas"
	// FlagRedisTLSCAFile, FlagRedisTLSCertFile and FlagRedisTLSKeyFile name the files of the
	// mounted TLS Secret (RedisTLSDir): the CA file when the manager's
	// --sidecar-redis-tls-secret is set, the certificate and key with
	// --sidecar-redis-tls-client-cert too. The sidecar reads them again at each new Redis
	// connection when they changed, so a rotated Secret needs no restart.
	FlagRedisTLSCAFile   = "redis-tls-ca-file"
	FlagRedisTLSCertFile = "redis-tls-cert-file"
	FlagRedisTLSKeyFile  = "redis-tls-key-file"
	// FlagRedisTLSServerName and FlagRedisTLSMinVersion are passed when the manager's
	// --sidecar-redis-tls-server-name and --sidecar-redis-tls-min-version are set.
	FlagRedisTLSServerName = "redis-tls-server-name"
	FlagRedisTLSMinVersion = "redis-tls-min-version"
)

// Environment variables set on the sidecar.
const (
	// EnvRedisURL is the Redis URL (from the manager's --sidecar-redis-url): the cluster's
	// Redis, which a namespace's own (EnvNamespaceRedisURL) replaces.
	EnvRedisURL = "REDLINE_REDIS_URL"
	// EnvNamespaceRedisURL is the Redis of the pod's namespace, from its ConfigMap
	// (the manager's redline-sidecar-redis, key url), optional: set and not empty, it replaces
	// EnvRedisURL and --redis-url, and the EnvNamespaceRedisTLS* variables replace every
	// --redis-tls-* flag (empty: unset). Unset (no ConfigMap yet) the sidecar keeps the
	// cluster's Redis and flags. Every injected pod names these variables alike, so that the
	// patch tells nothing of which Redis serves its namespace.
	EnvNamespaceRedisURL = "REDLINE_NAMESPACE_REDIS_URL"
	// The TLS settings of the namespace's Redis (see EnvNamespaceRedisURL): the values of
	// --redis-tls-server-name, --redis-tls-min-version, --redis-tls-ca-file,
	// --redis-tls-cert-file and --redis-tls-key-file.
	EnvNamespaceRedisTLSServerName = "REDLINE_NAMESPACE_REDIS_TLS_SERVER_NAME"
	EnvNamespaceRedisTLSMinVersion = "REDLINE_NAMESPACE_REDIS_TLS_MIN_VERSION"
	EnvNamespaceRedisTLSCAFile     = "REDLINE_NAMESPACE_REDIS_TLS_CA_FILE"
	EnvNamespaceRedisTLSCertFile   = "REDLINE_NAMESPACE_REDIS_TLS_CERT_FILE"
	EnvNamespaceRedisTLSKeyFile    = "REDLINE_NAMESPACE_REDIS_TLS_KEY_FILE"
	// EnvRedisPassword comes from key RedisSecretKey of a Secret in the pod's namespace; it is
	// unset when that Secret does not exist.
	EnvRedisPassword = "REDLINE_REDIS_PASSWORD"
	// EnvPodName is the pod's name (downward API).
	EnvPodName = "POD_NAME"
	// EnvPodNamespace is the pod's namespace (downward API).
	EnvPodNamespace = "POD_NAMESPACE"
	// EnvMemoryLimit is the sidecar container's memory limit in bytes (downward API
	// resourceFieldRef limits.memory); the sidecar sets Go's memory limit to
	// MemoryLimitPercent of it unless GOMEMLIMIT is set.
	EnvMemoryLimit = "REDLINE_MEMORY_LIMIT"
	// EnvBudgetRedisPoolSize, when set, is the pool the connection budget gives the pod's
	// workload and wins over FlagRedisPoolSize (which then carries the manager's default).
	// The injector sets it from a key of the namespace's sidecar ConfigMap that the manager
	// writes, optional: unset until the manager has written it. A pod that sets
	// AnnotationRedisPoolSize gets the flag alone.
	EnvBudgetRedisPoolSize = "REDLINE_BUDGET_REDIS_POOL_SIZE"
	// EnvFallbackReplicas is the default of FlagFallbackReplicas, set by the injector from a
	// key of the namespace's sidecar ConfigMap (optional, like EnvBudgetRedisPoolSize).
	EnvFallbackReplicas = "REDLINE_FALLBACK_REPLICAS"
	// MemoryLimitPercent is the share of the container's limit the Go runtime aims to stay
	// under: the rest is what the runtime does not count (stacks it cannot shrink at once,
	// fragmentation) and the kernel's socket buffers, charged to the same cgroup.
	MemoryLimitPercent = 85
	// RedisSecretKey is the key of the Redis password in the credentials Secret.
	RedisSecretKey = "password"
	// RedisUsernameKey is the key of the Redis ACL user in the credentials Secret (absent: the
	// default user).
	RedisUsernameKey = "username"
	// RedisSentinelUsernameKey and RedisSentinelSecretKey, with Sentinel, are the user and
	// password the sidecar authenticates to the sentinels with: a user that may only look the
	// master up and follow its switches (redisacl.SentinelReaderUser), never reconfigure the
	// group. Absent: no credential for the sentinels.
	RedisSentinelUsernameKey = "sentinel-username"
	RedisSentinelSecretKey   = "sentinel-password"
)

// Volumes and where the sidecar finds them.
const (
	// PoliciesVolume mounts the namespace's compiled policies ConfigMap (optional, so pods start
	// before the first policy exists).
	PoliciesVolume = "redline-policies"
	// PoliciesDir is the mount path of PoliciesVolume; the document is the file policies.json
	// in it.
	PoliciesDir = "/etc/redline/policies"
	// PodInfoVolume is a downward-API volume with the pod's labels.
	PodInfoVolume = "redline-podinfo"
	// PodInfoDir is the mount path of PodInfoVolume.
	PodInfoDir = "/etc/redline/podinfo"
	// PodLabelsFile holds the pod's labels, one key="value" a line (downward-API format).
	PodLabelsFile = PodInfoDir + "/" + PodLabelsFileName
	// PodLabelsFileName is PodLabelsFile's name inside PodInfoDir.
	PodLabelsFileName = "labels"
	// RedisCredentialsVolume mounts the pod namespace's Redis credentials Secret (optional, so
	// pods start before the controller has written it). A mounted Secret, not environment
	// variables: kubelet updates its files when the controller rotates the password, and the
	// sidecar reads them at every new connection, so a rotation needs no restart.
	RedisCredentialsVolume = "redline-redis-credentials"
	// RedisCredentialsDir is the mount path of RedisCredentialsVolume.
	RedisCredentialsDir = "/etc/redline/redis"
	// RedisTLSVolume mounts the Secret the manager's --sidecar-redis-tls-secret names, from the
	// pod's namespace: the CA that signed Redis's certificate (RedisTLSCAKey) and, for a Redis
	// that requires client certificates, the pod's certificate and key (RedisTLSCertKey,
	// RedisTLSKeyKey), the layout of a kubernetes.io/tls Secret as cert-manager writes it. Not
	// optional: a pod whose namespace lacks the Secret or a key of it does not start, and
	// kubelet says why in the pod's events, instead of a sidecar that cannot verify Redis and
	// decides every request by its failure mode.
	RedisTLSVolume = "redline-redis-tls"
	// RedisTLSDir is the mount path of RedisTLSVolume.
	RedisTLSDir = "/etc/redline/redis-tls"
	// Keys of the TLS Secret, and file names in RedisTLSDir.
	RedisTLSCAKey   = "ca.crt"
	RedisTLSCertKey = "tls.crt"
	RedisTLSKeyKey  = "tls.key"
)

// The decision log's modes (AnnotationDecisionLog, FlagDecisionLog).
const (
	DecisionLogOff     = "off"
	DecisionLogRefused = "refused"
	DecisionLogAll     = "all"
)
