package helm

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	. "github.com/onsi/gomega"
)

// syncFiles are the files of config/ that make chart-sync copies into the chart (the
// Makefile's CHART_SYNC_FILES).
var syncFiles = []string{
	"crd/bases/redline.dev_ratelimitpolicies.yaml",
	"crd/bases/redline.dev_redisbackends.yaml",
	"rbac/role.yaml",
	"rbac/leader_election_role.yaml",
	"webhook/rbac.yaml",
	"webhook/manifests.yaml",
	"deprecations/ratelimitpolicy.yaml",
}

const syncHint = "config/ is the source (make manifests generates it from the markers); run `make chart-sync` (make manifests runs it too) and commit charts/redline/files/config"

// TestChartInSyncWithConfig: the chart's copy of config/ is byte for byte what make
// chart-sync writes, and holds nothing else.
func TestChartInSyncWithConfig(t *testing.T) {
	root := RepoRoot()
	copyDir := filepath.Join(ChartDir(), "files", "config")
	for _, f := range syncFiles {
		want, err := os.ReadFile(filepath.Join(root, "config", f))
		if err != nil {
			t.Fatalf("reading config/%s: %v", f, err)
		}
		got, err := os.ReadFile(filepath.Join(copyDir, f))
		if err != nil {
			t.Errorf("charts/redline/files/config/%s is missing: %s", f, syncHint)
			continue
		}
		if string(got) != string(want) {
			t.Errorf("charts/redline/files/config/%s differs from config/%s: %s", f, f, syncHint)
		}
	}
	err := filepath.WalkDir(copyDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(copyDir, path)
		if !slices.Contains(syncFiles, filepath.ToSlash(rel)) {
			t.Errorf("charts/redline/files/config/%s is not a file make chart-sync writes: %s", rel, syncHint)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readConfig reads every object of the YAML files of config/<dir>.
func readConfig(t *testing.T, files ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(RepoRoot(), "config", f))
		if err != nil {
			t.Fatalf("reading config/%s: %v", f, err)
		}
		objs, err := Objects(string(b))
		if err != nil {
			t.Fatalf("config/%s: %v", f, err)
		}
		out = append(out, objs...)
	}
	return out
}

// renderAll renders the chart with every piece config/default has on: a Redis password Secret
// (config/ mounts one) and, for the webhook RBAC, the self-signed mode.
func renderAll(t *testing.T, certificates string) []*unstructured.Unstructured {
	t.Helper()
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	out, err := Render(ch, map[string]any{
		"redis":   map[string]any{"existingSecret": "redline-redis"},
		"webhook": map[string]any{"certificates": certificates},
	})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestChartMatchesConfig compares what the chart renders with config/ where they must agree:
// every RBAC rule, the webhook's rules and admission settings, the CRD, and the manager's
// flags, environment, ports and mounts. A difference names the object and what to change.
func TestChartMatchesConfig(t *testing.T) {
	cfg := readConfig(t, "rbac/role.yaml", "rbac/leader_election_role.yaml", "webhook/rbac.yaml",
		"webhook/manifests.yaml", "crd/bases/redline.dev_ratelimitpolicies.yaml", "crd/bases/redline.dev_redisbackends.yaml", "manager/manager.yaml")
	chartObjs := renderAll(t, "selfSigned")

	t.Run("rbac", func(t *testing.T) {
		for _, want := range cfg {
			if want.GetKind() != "ClusterRole" && want.GetKind() != "Role" {
				continue
			}
			got := Find(chartObjs, want.GetKind(), want.GetName())
			if got == nil {
				t.Errorf("%s %s of config/ is not in the chart: add it to charts/redline/templates/rbac.yaml (its rules from files/config)", want.GetKind(), want.GetName())
				continue
			}
			g := NewWithT(t)
			w, c := convert[rbacv1.ClusterRole](g, want), convert[rbacv1.ClusterRole](g, got)
			for _, r := range w.Rules {
				if !slices.ContainsFunc(c.Rules, func(x rbacv1.PolicyRule) bool { return reflect.DeepEqual(x, r) }) {
					t.Errorf("%s %s: rule %s is in config/ but not in the chart: %s", want.GetKind(), want.GetName(), ruleString(r), syncHint)
				}
			}
			for _, r := range c.Rules {
				if !slices.ContainsFunc(w.Rules, func(x rbacv1.PolicyRule) bool { return reflect.DeepEqual(x, r) }) {
					t.Errorf("%s %s: rule %s is in the chart but not in config/: the chart may not grant more than config/ (%s)", want.GetKind(), want.GetName(), ruleString(r), syncHint)
				}
			}
		}
	})

	t.Run("webhook", func(t *testing.T) {
		g := NewWithT(t)
		want := Find(cfg, "MutatingWebhookConfiguration", "redline-pod-injector")
		got := Find(chartObjs, "MutatingWebhookConfiguration", "redline-pod-injector")
		g.Expect(got).NotTo(BeNil(), "the chart has no MutatingWebhookConfiguration redline-pod-injector")
		wh, _, _ := unstructured.NestedSlice(want.Object, "webhooks")
		gh, _, _ := unstructured.NestedSlice(got.Object, "webhooks")
		g.Expect(gh).To(HaveLen(len(wh)), "webhooks of the chart and of config/webhook/manifests.yaml")
		for i := range wh {
			w, c := wh[i].(map[string]any), gh[i].(map[string]any)
			// The namespace selector is the chart's (the release namespace); the rest is config/'s.
			for _, k := range []string{"name", "admissionReviewVersions", "rules", "failurePolicy", "sideEffects", "timeoutSeconds", "reinvocationPolicy", "matchPolicy", "matchConditions"} {
				g.Expect(ToYAML(c[k])).To(Equal(ToYAML(w[k])), "webhook %v: %s differs from config/webhook/manifests.yaml (the chart's default must be config/'s; %s)", w["name"], k, syncHint)
			}
			// config/'s selector expressions (the opt-ins) are all in the chart's, the release
			// namespace's exclusion aside.
			we, _, _ := unstructured.NestedSlice(w, "namespaceSelector", "matchExpressions")
			ce, _, _ := unstructured.NestedSlice(c, "namespaceSelector", "matchExpressions")
			for _, e := range we {
				if e.(map[string]any)["key"] == "kubernetes.io/metadata.name" {
					continue
				}
				g.Expect(ce).To(ContainElement(e), "webhook %v: namespace selector expression %v of config/ is not in the chart (%s)", w["name"], e, syncHint)
			}
			wp, _, _ := unstructured.NestedString(w, "clientConfig", "service", "path")
			cp, _, _ := unstructured.NestedString(c, "clientConfig", "service", "path")
			g.Expect(cp).To(Equal(wp), "webhook path")
		}
	})

	t.Run("deprecations", func(t *testing.T) {
		g := NewWithT(t)
		for _, want := range readConfig(t, "deprecations/ratelimitpolicy.yaml") {
			got := Find(chartObjs, want.GetKind(), want.GetName())
			g.Expect(got).NotTo(BeNil(), "%s %s of config/deprecations is not in the chart (templates/deprecations.yaml)", want.GetKind(), want.GetName())
			g.Expect(ToYAML(got.Object["spec"])).To(Equal(ToYAML(want.Object["spec"])), "%s %s: the chart's spec differs from config/deprecations: %s", want.GetKind(), want.GetName(), syncHint)
		}
	})

	t.Run("crd", func(t *testing.T) {
		g := NewWithT(t)
		for _, name := range []string{"ratelimitpolicies.redline.dev", "redisbackends.redline.dev"} {
			want := Find(cfg, "CustomResourceDefinition", name)
			got := Find(chartObjs, "CustomResourceDefinition", name)
			g.Expect(want).NotTo(BeNil(), "config/crd/bases has no CRD %s", name)
			g.Expect(got).NotTo(BeNil(), "the chart renders no CRD %s", name)
			g.Expect(ToYAML(got.Object["spec"])).To(Equal(ToYAML(want.Object["spec"])), "the chart's CRD %s spec differs from config/crd/bases: %s", name, syncHint)
		}
	})

	t.Run("manager", func(t *testing.T) {
		for _, mode := range []string{"certManager", "selfSigned"} {
			t.Run(mode, func(t *testing.T) {
				want := configManager(t, mode)
				got := convert[appsv1.Deployment](NewWithT(t), Find(renderAll(t, mode), "Deployment", "redline-manager"))
				compareManager(t, want, got)
			})
		}
	})
}

// configManager is config/'s manager Deployment with config/default's patch applied, and for
// selfSigned the lines its comment says to change.
func configManager(t *testing.T, mode string) *appsv1.Deployment {
	t.Helper()
	g := NewWithT(t)
	dep := convert[appsv1.Deployment](g, Find(readConfig(t, "manager/manager.yaml"), "Deployment", "redline-manager"))
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "default", "manager_webhook_patch.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var patch []struct {
		Op, Path string
		Value    any
	}
	g.Expect(yaml.Unmarshal(b, &patch)).To(Succeed())
	c := &dep.Spec.Template.Spec.Containers[0]
	for _, p := range patch {
		raw, err := yaml.Marshal(p.Value)
		g.Expect(err).NotTo(HaveOccurred())
		switch p.Path {
		case "/spec/template/spec/containers/0/args/-":
			c.Args = append(c.Args, p.Value.(string))
		case "/spec/template/spec/containers/0/env/-":
			var e corev1.EnvVar
			g.Expect(yaml.Unmarshal(raw, &e)).To(Succeed())
			c.Env = append(c.Env, e)
		case "/spec/template/spec/containers/0/ports/-":
			var cp corev1.ContainerPort
			g.Expect(yaml.Unmarshal(raw, &cp)).To(Succeed())
			c.Ports = append(c.Ports, cp)
		case "/spec/template/spec/containers/0/volumeMounts/-":
			var m corev1.VolumeMount
			g.Expect(yaml.Unmarshal(raw, &m)).To(Succeed())
			c.VolumeMounts = append(c.VolumeMounts, m)
		case "/spec/template/spec/volumes/-":
			var v corev1.Volume
			g.Expect(yaml.Unmarshal(raw, &v)).To(Succeed())
			dep.Spec.Template.Spec.Volumes = append(dep.Spec.Template.Spec.Volumes, v)
		default:
			t.Fatalf("config/default/manager_webhook_patch.yaml patches %s, which this test does not know: teach configManager", p.Path)
		}
	}
	if mode == "selfSigned" {
		for i, a := range c.Args {
			if a == "--webhook-cert-mode=cert-manager" {
				c.Args[i] = "--webhook-cert-mode=self-signed"
			}
		}
		for i := range dep.Spec.Template.Spec.Volumes {
			if v := dep.Spec.Template.Spec.Volumes[i].Secret; v != nil && v.SecretName == "redline-webhook-server-cert" {
				v.SecretName = "redline-webhook-self-signed"
			}
		}
	}
	return dep
}

// chartOnlyValues are flags whose value the chart takes from values (so it may differ from
// config/'s placeholder).
var chartOnlyValues = map[string]bool{"--sidecar-image": true}

func flagMap(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		name, v, _ := strings.Cut(a, "=")
		m[name] = v
	}
	return m
}

func compareManager(t *testing.T, want, got *appsv1.Deployment) {
	t.Helper()
	if len(got.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("the chart's manager Deployment has %d containers, config/'s has 1", len(got.Spec.Template.Spec.Containers))
	}
	w, c := want.Spec.Template.Spec.Containers[0], got.Spec.Template.Spec.Containers[0]
	wf, cf := flagMap(w.Args), flagMap(c.Args)
	for name, v := range wf {
		cv, ok := cf[name]
		switch {
		case !ok:
			t.Errorf("manager flag %s is set by config/ (%q) but not by the chart: add it to charts/redline/templates/deployment.yaml (with a value in values.yaml and values.schema.json if users choose it)", name, v)
		case cv != v && !chartOnlyValues[name]:
			t.Errorf("manager flag %s is %q in config/ but %q in the chart's default: make charts/redline/templates/deployment.yaml (or values.yaml) say %q", name, v, cv, v)
		}
	}
	if !slices.Equal(c.Command, w.Command) {
		t.Errorf("manager command: chart %q, config/ %q", c.Command, w.Command)
	}
	envNames := func(env []corev1.EnvVar) map[string]string {
		m := map[string]string{}
		for _, e := range env {
			m[e.Name] = ToYAML(e)
		}
		return m
	}
	we, ce := envNames(w.Env), envNames(c.Env)
	for n, v := range we {
		if ce[n] != v {
			t.Errorf("manager env %s: config/ has\n%s\nthe chart has\n%s\nchange charts/redline/templates/deployment.yaml", n, v, ce[n])
		}
	}
	for _, p := range w.Ports {
		if !slices.ContainsFunc(c.Ports, func(x corev1.ContainerPort) bool { return x.Name == p.Name && x.ContainerPort == p.ContainerPort }) {
			t.Errorf("manager port %s (%d) of config/ is not in the chart's Deployment", p.Name, p.ContainerPort)
		}
	}
	for _, m := range w.VolumeMounts {
		if !slices.ContainsFunc(c.VolumeMounts, func(x corev1.VolumeMount) bool { return x.MountPath == m.MountPath && x.ReadOnly == m.ReadOnly }) {
			t.Errorf("manager mount %s (%s) of config/ is not in the chart's Deployment", m.Name, m.MountPath)
		}
	}
	volSecret := func(d *appsv1.Deployment, mount string) string {
		for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
			if m.MountPath == mount {
				for _, v := range d.Spec.Template.Spec.Volumes {
					if v.Name == m.Name && v.Secret != nil {
						return v.Secret.SecretName
					}
				}
			}
		}
		return ""
	}
	for _, m := range w.VolumeMounts {
		if ws, cs := volSecret(want, m.MountPath), volSecret(got, m.MountPath); ws != "" && ws != cs {
			t.Errorf("the Secret mounted at %s is %q in config/ but %q in the chart", m.MountPath, ws, cs)
		}
	}
	if *got.Spec.Replicas != *want.Spec.Replicas {
		t.Errorf("replicas: chart default %d, config/ %d", *got.Spec.Replicas, *want.Spec.Replicas)
	}
	if ToYAML(c.ReadinessProbe) != ToYAML(w.ReadinessProbe) || ToYAML(c.LivenessProbe) != ToYAML(w.LivenessProbe) {
		t.Errorf("manager probes differ from config/:\nchart %s %s\nconfig/ %s %s", ToYAML(c.ReadinessProbe), ToYAML(c.LivenessProbe), ToYAML(w.ReadinessProbe), ToYAML(w.LivenessProbe))
	}
	if ToYAML(c.SecurityContext) != ToYAML(w.SecurityContext) || ToYAML(got.Spec.Template.Spec.SecurityContext) != ToYAML(want.Spec.Template.Spec.SecurityContext) {
		t.Errorf("security contexts differ from config/ (the restricted profile)")
	}
}

func ruleString(r rbacv1.PolicyRule) string {
	return fmt.Sprintf("{apiGroups: %q, resources: %q, resourceNames: %q, verbs: %q}", r.APIGroups, r.Resources, r.ResourceNames, r.Verbs)
}
