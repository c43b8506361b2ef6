package podinject

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cache of the sidecars' Redis ConfigMaps keeps a few hundred bytes of one, whatever a
// tenant wrote under that name, and what it keeps of an oversized or binary one never equals
// what the manager writes, so the reconciler rewrites it.
func TestSlimRedisConfigMapBoundsWhatATenantWrote(t *testing.T) {
	g := NewWithT(t)
	own := map[string]string{"url": "redis://backend:6379", "tls-server-name": "", "tls-min-version": ""}
	slim := func(cm *corev1.ConfigMap) *corev1.ConfigMap {
		out, err := slimRedisConfigMap(cm)
		g.Expect(err).NotTo(HaveOccurred())
		return out.(*corev1.ConfigMap)
	}
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: RedisConfigMapName, Namespace: "t", ResourceVersion: "7",
			Labels:      map[string]string{managedByLabel: managedByValue, "big": strings.Repeat("x", 60)},
			Annotations: map[string]string{"a": strings.Repeat("y", 200_000)}}
	}

	got := slim(&corev1.ConfigMap{ObjectMeta: meta(), Data: own})
	g.Expect(got.Data).To(Equal(own), "the manager's own content is kept to compare")
	g.Expect(got.Labels).To(Equal(map[string]string{managedByLabel: managedByValue}))
	g.Expect(got.Annotations).To(BeEmpty())
	g.Expect(got.ResourceVersion).To(Equal("7"))

	for name, cm := range map[string]*corev1.ConfigMap{
		"a megabyte of data": {ObjectMeta: meta(), Data: map[string]string{"url": strings.Repeat("z", 1<<20)}},
		"binary data":        {ObjectMeta: meta(), Data: own, BinaryData: map[string][]byte{"b": {1}}},
	} {
		got := slim(cm)
		g.Expect(got.Data).NotTo(Equal(own), name)
		g.Expect(got.Data).To(HaveLen(1), name)
		g.Expect(got.BinaryData).To(BeNil(), name)
	}
}

// Many workloads' keys make the manager's own content larger than the cache keeps: it is kept
// as a digest, which equals the digest of the same content and of no other.
func TestSlimRedisConfigMapKeepsADigestOfManyWorkloads(t *testing.T) {
	g := NewWithT(t)
	own := map[string]string{RedisConfigMapURLKey: "redis://r:6379"}
	for i := range 200 {
		own[workloadKey(ReplicasKeyPrefix, kindDeployment, fmt.Sprintf("workload-%03d", i))] = "30"
	}
	out, err := slimRedisConfigMap(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: RedisConfigMapName, Namespace: "t"}, Data: own})
	g.Expect(err).NotTo(HaveOccurred())
	kept := out.(*corev1.ConfigMap).Data
	g.Expect(kept).To(HaveLen(1))
	g.Expect(kept[""]).To(HavePrefix("sha256:"))
	g.Expect(sameData(kept, own)).To(BeTrue(), "unchanged: not rewritten")
	changed := maps.Clone(own)
	changed[workloadKey(ReplicasKeyPrefix, kindDeployment, "workload-007")] = "31"
	g.Expect(sameData(kept, changed)).To(BeFalse(), "a workload's count changed: rewritten")
}
