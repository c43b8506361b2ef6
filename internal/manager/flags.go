// Package manager holds the manager's command line: its flags, bound onto a flag set that
// cmd/manager parses and the flags reference (internal/docgen) reads, so the two cannot differ.
package manager

import (
	"flag"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/controller/topkeysstatus"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// EnvPodNamespace is the manager's own namespace (the downward API), the default of
// --webhook-namespace.
const EnvPodNamespace = "POD_NAMESPACE"

// defaultNamespace is --webhook-namespace's default outside a pod.
const defaultNamespace = "redline-system"

// FlagEnv names the environment variable each flag takes its default from, where one does.
var FlagEnv = map[string]string{
	"redis-url":         contract.EnvRedisURL,
	"webhook-namespace": EnvPodNamespace,
}

// Options is what the manager's flags set.
type Options struct {
	MetricsAddr, ProbeAddr  string
	LeaderElect             bool
	LeaderElectionNamespace string
	RedisURL                string
	RedisPasswordFile       string
	RedisUsername           string
	RedisTimeout            time.Duration
	CheckInterval           time.Duration
	MaxBackoff              time.Duration
	HeartbeatTTL, Resync    time.Duration
	// TopKeysInterval is controller.Config.TopKeysInterval, 0 or less for off.
	TopKeysInterval         time.Duration
	RedisMaxClients         int64
	BudgetInterval          time.Duration
	TenantACL, ACLKeySecret string
	SentinelUser            string
	SentinelPasswordFile    string
	CredentialRotation      time.Duration
	RedisTLS                redisconn.TLSOptions
	// Webhook is the pod injector's configuration (--sidecar-*, --webhook-*, --native-sidecars).
	Webhook podinject.Config
	// Zap is the logger's (--zap-*).
	Zap zap.Options
}

// BindFlags defines every flag of the manager on fs, the injector's, the logger's and
// controller-runtime's --kubeconfig included, with defaults read through getenv, and returns
// the options they set once fs is parsed.
func BindFlags(fs *flag.FlagSet, getenv func(string) string) *Options {
	o := &Options{Webhook: podinject.DefaultConfig()}
	// Through getenv rather than the process's environment, so the reference shows one default.
	o.Webhook.Namespace = envOr(getenv, EnvPodNamespace, defaultNamespace)
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 turns it off.")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false, "Elect a leader, so that only one of several replicas writes.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's).")
	fs.StringVar(&o.RedisURL, "redis-url", envOr(getenv, contract.EnvRedisURL, "redis://127.0.0.1:6379"),
		"Redis to load scripts into: redis://host:port, rediss://host:port (TLS), redis://h1:p,h2:p,h3:p (cluster) "+
			"or redis+sentinel://s1:p,s2:p/master. Env "+contract.EnvRedisURL+". Put no password here: use --redis-password-file.")
	fs.StringVar(&o.RedisPasswordFile, "redis-password-file", "", "File holding the Redis password (e.g. a mounted Secret). Env "+contract.EnvRedisPassword+" is read otherwise.")
	fs.StringVar(&o.RedisUsername, "redis-username", "", "The Redis ACL user the manager authenticates as with the password of --redis-password-file (empty: the default user). It needs what the default user has (+@all ~* &*): it sets the namespaces' ACL users, loads scripts and reads every key. Never given to sidecars.")
	fs.StringVar(&o.SentinelUser, "redis-sentinel-username", "", "With redis+sentinel://: the sentinels' ACL user the manager authenticates as (empty: the default user). It must be able to run ACL SETUSER and SENTINEL on every sentinel.")
	fs.StringVar(&o.SentinelPasswordFile, "redis-sentinel-password-file", "", "With redis+sentinel://: file holding the sentinels' admin password (e.g. a mounted Secret). Never given to sidecars: they get a read-only sentinel user in their namespace's Secret.")
	fs.StringVar(&o.RedisTLS.CAFile, "redis-tls-ca-file", "", "With rediss:// (or rediss+sentinel://): PEM file of the CAs that sign Redis's and the sentinels' certificates, instead of the system's (e.g. ca.crt of a mounted Secret).")
	fs.StringVar(&o.RedisTLS.CertFile, "redis-tls-cert-file", "", "With rediss://: PEM file of the manager's client certificate, for a Redis that requires one (tls-auth-clients); with --redis-tls-key-file. Read again at a new connection when it changed.")
	fs.StringVar(&o.RedisTLS.KeyFile, "redis-tls-key-file", "", "With rediss://: PEM file of the client certificate's private key.")
	fs.StringVar(&o.RedisTLS.ServerName, "redis-tls-server-name", "", "With rediss://: the name Redis's certificates must carry (empty: the host each connection dials, as the URL, the cluster or the sentinels name it).")
	fs.StringVar(&o.RedisTLS.MinVersion, "redis-tls-min-version", "", "With rediss://: oldest TLS version accepted, 1.2 or 1.3 (empty: 1.2).")
	fs.DurationVar(&o.RedisTimeout, "redis-timeout", backend.DefaultTimeout, "Bound on the script check of one reconcile.")
	fs.DurationVar(&o.CheckInterval, "script-check-interval", backend.DefaultCheckInterval, "How often every Redis node, replicas included, is checked for the scripts and for a restart (which lost them and the ACL users): after restarts, failovers, SCRIPT FLUSH.")
	fs.DurationVar(&o.MaxBackoff, "max-backoff", backend.DefaultMaxBackoff, "Longest retry delay while Redis is unavailable.")
	fs.DurationVar(&o.HeartbeatTTL, "heartbeat-ttl", fleet.TTL(fleet.DefaultInterval), "How long a sidecar counts as live after its last heartbeat (match the sidecars').")
	fs.DurationVar(&o.Resync, "resync-interval", 15*time.Second, "How often each namespace is re-read to follow sidecar heartbeats into the Enforced condition.")
	fs.Int64Var(&o.RedisMaxClients, "redis-maxclients", 0, "Redis's maxclients, for a Redis that refuses CONFIG GET (managed services); 0 reads it with CONFIG GET.")
	fs.DurationVar(&o.TopKeysInterval, "top-keys-interval", topkeysstatus.DefaultInterval, "How often the sidecars' top-keys summaries are merged into the policies' status.rules (at most 16 policies of a namespace and 64 in all written per interval); 0 or less turns it off.")
	fs.DurationVar(&o.BudgetInterval, "budget-interval", 30*time.Second, "How often the Redis connection budget is recomputed without a workload change (follows connected_clients).")
	fs.StringVar(&o.TenantACL, "redis-tenant-acl", tenantacl.ModeAuto, "Per-namespace Redis users: auto (an ACL user per namespace with policies, limited to its keys; where Redis refuses ACL commands, the admin's shared credential and TenantIsolation=False), required (auto, but do not start when Redis refuses ACLs) or off (the admin's shared credential everywhere).")
	fs.StringVar(&o.ACLKeySecret, "redis-acl-key-secret", "redline-redis-acl", "Secret in the manager's namespace holding the key namespaces' Redis passwords are derived from (created on first use).")
	fs.DurationVar(&o.CredentialRotation, "redis-credential-rotation", 24*time.Hour, "How often each namespace's Redis password changes; the previous one stays valid one more period.")
	o.Webhook.BindFlags(fs)
	o.Zap.BindFlags(fs)
	// controller-runtime reads --kubeconfig when the manager asks for its REST config.
	config.RegisterFlags(fs)
	return o
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}
