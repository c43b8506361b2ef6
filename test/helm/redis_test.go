package helm

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// managerDeployment renders the chart with vals (YAML) and returns the manager's Deployment.
func managerDeployment(t *testing.T, values string) *appsv1.Deployment {
	t.Helper()
	g := NewWithT(t)
	vals, err := ParseValues([]byte(values))
	g.Expect(err).NotTo(HaveOccurred())
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	out, err := Render(ch, vals)
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := Objects(out)
	g.Expect(err).NotTo(HaveOccurred())
	return convert[appsv1.Deployment](g, Find(objs, "Deployment", "redline-manager"))
}

func volumeNamed(spec corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// TestRedisTLSValuesReachManager: redis.tls becomes the manager's --redis-tls-* flags over
// the files of its mounted Secret, and the --sidecar-redis-tls-* flags that have the webhook
// mount the namespace's Secret into sidecars; redis.sentinel the sentinels' credential. Unset,
// nothing of either is passed or mounted.
func TestRedisTLSValuesReachManager(t *testing.T) {
	t.Run("unset", func(t *testing.T) {
		g := NewWithT(t)
		dep := managerDeployment(t, "redis: {url: rediss://redis.example.internal:6380}")
		for name := range flagMap(dep.Spec.Template.Spec.Containers[0].Args) {
			g.Expect(name).NotTo(Or(HavePrefix("--redis-tls-"), HavePrefix("--sidecar-redis-tls-"), HavePrefix("--redis-sentinel-")))
		}
		g.Expect(volumeNamed(dep.Spec.Template.Spec, "redis-tls")).To(BeNil())
		g.Expect(volumeNamed(dep.Spec.Template.Spec, "redis-sentinel-credentials")).To(BeNil())
	})
	t.Run("a private CA", func(t *testing.T) {
		g := NewWithT(t)
		dep := managerDeployment(t, "redis: {url: rediss://redis.example.internal:6380, tls: {secretName: redline-redis-ca, sidecarSecretName: redis-ca}}")
		args := flagMap(dep.Spec.Template.Spec.Containers[0].Args)
		g.Expect(args).To(HaveKeyWithValue("--redis-tls-ca-file", "/etc/redline/redis-tls/ca.crt"))
		g.Expect(args).To(HaveKeyWithValue("--sidecar-redis-tls-secret", "redis-ca"))
		g.Expect(args).NotTo(HaveKey("--redis-tls-cert-file"))
		g.Expect(args).NotTo(HaveKey("--sidecar-redis-tls-client-cert"))
		vol := volumeNamed(dep.Spec.Template.Spec, "redis-tls")
		g.Expect(vol).NotTo(BeNil())
		g.Expect(vol.Secret.SecretName).To(Equal("redline-redis-ca"))
		g.Expect(vol.Secret.Items).To(Equal([]corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}))
		g.Expect(dep.Spec.Template.Spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "redis-tls", MountPath: "/etc/redline/redis-tls", ReadOnly: true}))
	})
	t.Run("client certificates, a server name, TLS 1.3, Sentinel", func(t *testing.T) {
		g := NewWithT(t)
		dep := managerDeployment(t, `redis:
  url: rediss+sentinel://s0:26379,s1:26379,s2:26379/mymaster
  sentinel: {existingSecret: sentinel-admin, username: admin}
  tls: {secretName: manager-tls, sidecarSecretName: redis-tls, clientCertificate: true, serverName: redis.internal, minVersion: "1.3"}
`)
		args := flagMap(dep.Spec.Template.Spec.Containers[0].Args)
		for k, v := range map[string]string{
			"--redis-tls-ca-file": "/etc/redline/redis-tls/ca.crt", "--redis-tls-cert-file": "/etc/redline/redis-tls/tls.crt",
			"--redis-tls-key-file": "/etc/redline/redis-tls/tls.key", "--redis-tls-server-name": "redis.internal",
			"--redis-tls-min-version": "1.3", "--sidecar-redis-tls-secret": "redis-tls", "--sidecar-redis-tls-client-cert": "true",
			"--sidecar-redis-tls-server-name": "redis.internal", "--sidecar-redis-tls-min-version": "1.3",
			"--redis-sentinel-password-file": "/etc/redline/redis-sentinel/password", "--redis-sentinel-username": "admin",
		} {
			g.Expect(args).To(HaveKeyWithValue(k, v))
		}
		g.Expect(volumeNamed(dep.Spec.Template.Spec, "redis-tls").Secret.Items).To(HaveLen(3))
		g.Expect(volumeNamed(dep.Spec.Template.Spec, "redis-sentinel-credentials").Secret.SecretName).To(Equal("sentinel-admin"))
		g.Expect(dep.Spec.Template.Spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "redis-sentinel-credentials", MountPath: "/etc/redline/redis-sentinel", ReadOnly: true}))
	})
}

// TestRedisValuesRefused: what is wrong with redis.url or redis.tls fails helm install with a
// message naming the value, from the schema (types, enums, names, credentials in the URL) or
// from the chart (what the schema cannot compare).
func TestRedisValuesRefused(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	const schemaErr = "values don't meet the specifications of the schema"
	for _, tt := range []struct {
		name, values string
		want         []string
	}{
		{"a password in the URL", "url: redis://:secret@redis:6379", []string{schemaErr, "at '/redis/url'"}},
		{"the sentinels' password in the URL", "url: redis+sentinel://:secret@s0:26379/mymaster", []string{schemaErr, "at '/redis/url'"}},
		{"a typo under tls", "url: rediss://r:6380\ntls: {caSecret: ca}", []string{schemaErr, "at '/redis/tls': additional properties 'caSecret' not allowed"}},
		{"TLS 1.1", "url: rediss://r:6380\ntls: {minVersion: \"1.1\"}", []string{schemaErr, "at '/redis/tls/minVersion': value must be one of '', '1.2', '1.3'"}},
		{"a version as a number", "url: rediss://r:6380\ntls: {minVersion: 1.3}", []string{schemaErr, "at '/redis/tls/minVersion': got number, want string"}},
		{"not a Secret name", "url: rediss://r:6380\ntls: {secretName: Redis_TLS, sidecarSecretName: redis-tls}", []string{schemaErr, "at '/redis/tls/secretName'"}},
		{"a client certificate as a string", "url: rediss://r:6380\ntls: {clientCertificate: \"yes\"}", []string{schemaErr, "at '/redis/tls/clientCertificate': got string, want boolean"}},
		{"a typo under sentinel", "sentinel: {password: x}", []string{schemaErr, "at '/redis/sentinel': additional properties 'password' not allowed"}},
		{"TLS settings for a URL without TLS", "url: redis://r:6379\ntls: {serverName: redis.internal}", []string{"redis.tls is set but redis.url (redis://r:6379) does not use TLS"}},
		{"a client certificate without a Secret", "url: rediss://r:6380\ntls: {clientCertificate: true, sidecarSecretName: t}", []string{"redis.tls.clientCertificate needs redis.tls.secretName"}},
		{"a client certificate for the manager only", "url: rediss://r:6380\ntls: {clientCertificate: true, secretName: t}", []string{"redis.tls.clientCertificate needs redis.tls.sidecarSecretName too"}},
		{"the CA for the manager only", "url: rediss://r:6380\ntls: {secretName: t}", []string{"redis.tls.secretName is set but redis.tls.sidecarSecretName is not"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			vals, err := ParseValues([]byte("redis:\n  " + strings.ReplaceAll(tt.values, "\n", "\n  ") + "\n"))
			g.Expect(err).NotTo(HaveOccurred())
			_, err = Render(ch, vals)
			g.Expect(err).To(HaveOccurred())
			for _, w := range tt.want {
				g.Expect(err).To(MatchError(ContainSubstring(w)))
			}
		})
	}
	t.Run("sidecars on another Redis need no Secret of the manager's", func(t *testing.T) {
		g := NewWithT(t)
		vals, err := ParseValues([]byte("redis: {url: rediss://r:6380, tls: {secretName: t}}\nsidecar: {redisUrl: rediss://public.example:6380}\n"))
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Render(ch, vals)
		g.Expect(err).NotTo(HaveOccurred())
	})
}
