package podinject

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// sidecarContainer renders the sidecar for the checked annotations p.
func sidecarContainer(cfg *Config, p params, native bool) corev1.Container {
	c := corev1.Container{
		Name:  contract.ContainerName,
		Image: cfg.SidecarImage,
		Args:  sidecarArgs(cfg, p),
		Ports: []corev1.ContainerPort{
			{Name: contract.ListenPortName, ContainerPort: p.listenPort, Protocol: corev1.ProtocolTCP},
			{Name: contract.AdminPortName, ContainerPort: contract.AdminPort, Protocol: corev1.ProtocolTCP},
		},
		Env:       sidecarEnv(cfg, p),
		Resources: p.resources,
		VolumeMounts: []corev1.VolumeMount{
			{Name: contract.PoliciesVolume, MountPath: contract.PoliciesDir, ReadOnly: true},
			{Name: contract.PodInfoVolume, MountPath: contract.PodInfoDir, ReadOnly: true},
		},
		ReadinessProbe:           httpProbe(contract.ReadyzPath, 5, 3),
		LivenessProbe:            httpProbe(contract.HealthzPath, 10, 3),
		ImagePullPolicy:          corev1.PullPolicy(cfg.SidecarImagePullPolicy),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             new(true),
			RunAsUser:                ptr.To[int64](contract.RunAsUser),
			RunAsGroup:               ptr.To[int64](contract.RunAsUser),
			ReadOnlyRootFilesystem:   new(true),
			AllowPrivilegeEscalation: new(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	if cfg.RedisSecret != "" {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{
			Name: contract.RedisCredentialsVolume, MountPath: contract.RedisCredentialsDir, ReadOnly: true,
		})
	}
	if m, ok := p.redisTLS.volumeMount(); ok {
		c.VolumeMounts = append(c.VolumeMounts, m)
	}
	if p.exposeDecisionAPI {
		c.Ports = append(c.Ports,
			corev1.ContainerPort{Name: contract.CheckPortName, ContainerPort: contract.CheckPort, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{Name: contract.GRPCPortName, ContainerPort: contract.GRPCPort, Protocol: corev1.ProtocolTCP})
	}
	if native {
		c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	}
	return c
}

// sidecarArgs are the sidecar's flags for the checked annotations p.
func sidecarArgs(cfg *Config, p params) []string {
	// The decision faces stay on loopback, reachable from the pod's own containers only,
	// unless the pod asks for them on the pod network.
	decisionHost := contract.LoopbackHost
	if p.exposeDecisionAPI {
		decisionHost = ""
	}
	args := []string{
		fmt.Sprintf("--%s=:%d", contract.FlagListen, p.listenPort),
		fmt.Sprintf("--%s=%s:%d", contract.FlagUpstream, contract.UpstreamHost, p.upstreamPort),
		fmt.Sprintf("--%s=:%d", contract.FlagAdminListen, contract.AdminPort),
		fmt.Sprintf("--%s=%s:%d", contract.FlagCheckListen, decisionHost, contract.CheckPort),
		fmt.Sprintf("--%s=%s:%d", contract.FlagGRPCListen, decisionHost, contract.GRPCPort),
		fmt.Sprintf("--%s=%s", contract.FlagConfigDir, contract.PoliciesDir),
		fmt.Sprintf("--%s=%s", contract.FlagPodLabels, contract.PodLabelsFile),
	}
	if p.upstreamProtocol != "" {
		args = append(args, fmt.Sprintf("--%s=%s", contract.FlagUpstreamProtocol, p.upstreamProtocol))
	}
	if p.failureMode != "" {
		args = append(args, fmt.Sprintf("--%s=%s", contract.FlagFailureMode, p.failureMode))
	}
	if p.maxProcs > 0 {
		args = append(args, fmt.Sprintf("--%s=%d", contract.FlagMaxProcs, p.maxProcs))
	}
	if p.trustedHops > 0 {
		args = append(args, fmt.Sprintf("--%s=%d", contract.FlagTrustedHops, p.trustedHops))
	}
	if p.decisionLog != "" && p.decisionLog != contract.DecisionLogOff {
		args = append(args, fmt.Sprintf("--%s=%s", contract.FlagDecisionLog, p.decisionLog))
	}
	if p.redisPoolSize > 0 {
		args = append(args, fmt.Sprintf("--%s=%d", contract.FlagRedisPoolSize, p.redisPoolSize))
	}
	if p.leaseKeys > 0 {
		args = append(args, fmt.Sprintf("--%s=%d", contract.FlagLeaseKeys, p.leaseKeys))
	}
	if p.leaseHorizon != nil {
		args = append(args, fmt.Sprintf("--%s=%s", contract.FlagLeaseHorizon, *p.leaseHorizon))
	}
	if p.redisTimeout > 0 {
		args = append(args, fmt.Sprintf("--%s=%s", contract.FlagRedisTimeout, p.redisTimeout))
	}
	if cfg.RedisSecret != "" {
		args = append(args, fmt.Sprintf("--%s=%s", contract.FlagRedisCredentialsDir, contract.RedisCredentialsDir))
	}
	return append(args, p.redisTLS.args()...)
}

// sidecarEnv is the sidecar's environment: the cluster's Redis, then the namespace's from its
// ConfigMap, which the sidecar takes instead where it names one (contract.EnvNamespaceRedisURL):
// the same variables in every namespace's pods, whichever Redis serves it; then the workload's
// pool and replicas, the pod's name and namespace, its memory limit.
func sidecarEnv(cfg *Config, p params) []corev1.EnvVar {
	var env []corev1.EnvVar
	if cfg.RedisURL != "" {
		env = append(env, corev1.EnvVar{Name: contract.EnvRedisURL, Value: cfg.RedisURL})
	}
	env = append(env, namespaceRedisEnv()...)
	env = append(env, p.workloadEnv...)
	return append(env,
		fieldEnv(contract.EnvPodName, "metadata.name"),
		fieldEnv(contract.EnvPodNamespace, "metadata.namespace"),
		// The sidecar sets Go's memory limit from its container's (contract.MemoryLimitPercent).
		corev1.EnvVar{Name: contract.EnvMemoryLimit, ValueFrom: &corev1.EnvVarSource{
			ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: contract.ContainerName, Resource: "limits.memory"},
		}},
	)
}

// namespaceRedisEnv are the variables the sidecar reads its namespace's Redis from, keys of
// RedisConfigMapName. Optional: a pod that starts before the manager has written it (or in a
// namespace the cluster's Redis serves) runs on the cluster's Redis.
func namespaceRedisEnv() []corev1.EnvVar {
	return []corev1.EnvVar{
		configMapEnv(contract.EnvNamespaceRedisURL, RedisConfigMapURLKey),
		configMapEnv(contract.EnvNamespaceRedisTLSServerName, RedisConfigMapTLSServerNameKey),
		configMapEnv(contract.EnvNamespaceRedisTLSMinVersion, RedisConfigMapTLSMinVersionKey),
		configMapEnv(contract.EnvNamespaceRedisTLSCAFile, RedisConfigMapTLSCAFileKey),
		configMapEnv(contract.EnvNamespaceRedisTLSCertFile, RedisConfigMapTLSCertFileKey),
		configMapEnv(contract.EnvNamespaceRedisTLSKeyFile, RedisConfigMapTLSKeyFileKey),
	}
}

// configMapEnv is the variable name set, where it exists, from key of the namespace's
// RedisConfigMapName.
func configMapEnv(name, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: RedisConfigMapName}, Key: key, Optional: new(true),
	}}}
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path},
	}}
}

func httpProbe(path string, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromInt32(contract.AdminPort), Scheme: corev1.URISchemeHTTP,
		}},
		PeriodSeconds: period, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: failures,
	}
}

// sidecarVolumes are the policies ConfigMap, the downward-API labels, the namespace's Redis
// credentials and its Redis TLS Secret.
func sidecarVolumes(cfg *Config, p params) []corev1.Volume {
	vols := []corev1.Volume{
		{Name: contract.PoliciesVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: policydoc.ConfigMapName},
			// Pods start before the namespace's first policy; the sidecar sees the file appear.
			Optional:    new(true),
			DefaultMode: ptr.To[int32](0o444),
		}}},
		{Name: contract.PodInfoVolume, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{
				Path: contract.PodLabelsFileName, FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"},
			}},
			DefaultMode: ptr.To[int32](0o444),
		}}},
	}
	if cfg.RedisSecret != "" {
		// The Secret the controller writes per namespace (its own Redis user) or, where Redis
		// refuses ACLs, the one the admin provides. Optional: pods start before it exists, and
		// a Redis without a password needs none. A volume, not environment variables, so that
		// a rotated password reaches the running sidecar (see contract.RedisCredentialsVolume).
		vols = append(vols, corev1.Volume{Name: contract.RedisCredentialsVolume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{
				SecretName: cfg.RedisSecret, Optional: new(true),
				// Readable by the sidecar's non-root user whatever the pod's fsGroup; the pod's
				// other containers could mount the Secret of their own namespace anyway.
				DefaultMode: ptr.To[int32](0o444),
				Items: []corev1.KeyToPath{
					{Key: contract.RedisUsernameKey, Path: contract.RedisUsernameKey},
					{Key: contract.RedisSecretKey, Path: contract.RedisSecretKey},
					{Key: contract.RedisSentinelUsernameKey, Path: contract.RedisSentinelUsernameKey},
					{Key: contract.RedisSentinelSecretKey, Path: contract.RedisSentinelSecretKey},
				},
			},
		}})
	}
	if v, ok := p.redisTLS.volume(); ok {
		vols = append(vols, v)
	}
	return vols
}
