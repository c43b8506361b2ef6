package helm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// alertRun records which of the chart's alerts fired in the run.
type alertRun struct {
	api   promv1.API
	fired map[string]bool
}

// expect waits until alert name fires with labels, and logs what Prometheus returned.
func (r *alertRun) expect(ctx context.Context, t *testing.T, name string, labels model.LabelSet) {
	t.Helper()
	a, err := waitFiring(ctx, r.api, name, labels)
	if err != nil {
		t.Error(err)
		return
	}
	r.fired[name] = true
	t.Logf("alert %s fired: labels %v, value %s", name, a.Labels, a.Value)
}

// provokeAlerts drives the alerts that need more than Redis down over their thresholds, one
// phase each, with traffic flowing.
func provokeAlerts(ctx context.Context, t *testing.T, st *stack.Stack, sidecars []*stack.Sidecar, alerts *alertRun) {
	t.Helper()
	shop := model.LabelSet{"namespace": e2eNamespace}
	expectFiring := func(name string, labels model.LabelSet) {
		t.Helper()
		alerts.expect(ctx, t, name, labels)
	}

	// Phase: Redis slow. A script keeps Redis busy 30 ms at a time (below the sidecars'
	// call deadline, so decisions still come from Redis): every round trip waits behind it.
	stopSlow := busyRedis(ctx, t, st.Redis.Addr(), 30*time.Millisecond)
	expectFiring("RedlineRedisSlow", shop)
	stopSlow()

	// Phase: the connection budget over. An HPA lets the workload grow to 100,000 pods,
	// whose pools would need more connections than Redis's maxclients.
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: e2eNamespace, Name: "shop"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "shop"},
			MinReplicas:    ptr.To[int32](2),
			MaxReplicas:    100000,
		},
	}
	if err := st.Client.Create(ctx, hpa); err != nil {
		t.Fatalf("creating the HPA: %v", err)
	}
	expectFiring("RedlineConnectionBudget", nil)
	if err := st.Client.Delete(ctx, hpa); err != nil {
		t.Fatalf("deleting the HPA: %v", err)
	}

	// Phase: a kubelet behind on one pod's volumes keeps its sidecar on the last
	// configuration, so the policy changed since is not Enforced.
	sidecars[0].FreezeVolumes()
	open := &v1alpha1.RateLimitPolicy{}
	if err := st.Client.Get(ctx, client.ObjectKey{Namespace: e2eNamespace, Name: "open"}, open); err != nil {
		t.Fatal(err)
	}
	before := open.DeepCopy()
	open.Spec.Rules[0].Limit.Requests = 2000
	if err := st.Client.Patch(ctx, open, client.MergeFrom(before)); err != nil {
		t.Fatalf("changing policy open: %v", err)
	}
	expectFiring("RedlinePolicyNotEnforced", model.LabelSet{"namespace": e2eNamespace, "policy": "open"})

	// Phase: with the manager down, a tenant's write into redline-policies reaches the other
	// sidecar, which refuses it and keeps the last good policies; the manager, back, restores it.
	if err := st.Manager.Stop(10 * time.Second); err != nil {
		t.Fatalf("stopping the manager: %v", err)
	}
	cm := &corev1.ConfigMap{}
	if err := st.Client.Get(ctx, client.ObjectKey{Namespace: e2eNamespace, Name: policydoc.ConfigMapName}, cm); err != nil {
		t.Fatal(err)
	}
	cmBefore := cm.DeepCopy()
	cm.Data[policydoc.DataKey] = "not a policy document"
	if err := st.Client.Patch(ctx, cm, client.MergeFrom(cmBefore)); err != nil {
		t.Fatalf("writing over %s: %v", policydoc.ConfigMapName, err)
	}
	expectFiring("RedlineConfigReloadErrors", model.LabelSet{"namespace": e2eNamespace, "pod": model.LabelValue(sidecars[1].Pod.Name)})
	if err := st.RestartManager(ctx); err != nil {
		t.Fatalf("starting the manager again: %v", err)
	}

}

// firingRules renders the chart's alerts as the real-Prometheus run evaluates them: the
// default thresholds, with `for` at 0s, since each phase lasts seconds, not minutes.
func firingRules(t *testing.T) []byte {
	t.Helper()
	rule := renderedRulesWith(t, map[string]any{"for": "0s", "notEnforcedFor": "0s"})
	b, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitRulesHealthy waits until Prometheus has evaluated every rule, and fails if any
// evaluation errs (an expression the real server refuses or cannot compute).
func waitRulesHealthy(ctx context.Context, api promv1.API) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := api.Rules(ctx, nil)
		if err != nil {
			return fmt.Errorf("reading the rules: %w", err)
		}
		pending, n := 0, 0
		for _, g := range res.Groups {
			for _, r := range g.Rules {
				a, ok := r.(promv1.AlertingRule)
				if !ok {
					continue
				}
				n++
				switch a.Health {
				case promv1.RuleHealthBad:
					return fmt.Errorf("alert %s does not evaluate: %s", a.Name, a.LastError)
				case promv1.RuleHealthUnknown:
					pending++
				}
			}
		}
		if n == 0 {
			return errors.New("prometheus loaded no alerting rules")
		}
		if pending == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d alerts never evaluated", pending, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// firing lists the alerts Prometheus has firing, as name{labels}.
func firing(ctx context.Context, api promv1.API) ([]string, error) {
	res, err := api.Alerts(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the alerts: %w", err)
	}
	var out []string
	for _, a := range res.Alerts {
		if a.State == promv1.AlertStateFiring {
			out = append(out, a.Labels.String())
		}
	}
	return out, nil
}

// waitFiring waits up to 90 s until alert name fires with labels that include want.
func waitFiring(ctx context.Context, api promv1.API, name string, want model.LabelSet) (promv1.Alert, error) {
	deadline := time.Now().Add(90 * time.Second)
	var last []string
	for {
		res, err := api.Alerts(ctx)
		if err == nil {
			last = last[:0]
			for _, a := range res.Alerts {
				if a.State != promv1.AlertStateFiring {
					continue
				}
				last = append(last, a.Labels.String())
				if string(a.Labels[model.AlertNameLabel]) != name {
					continue
				}
				match := true
				for k, v := range want {
					match = match && a.Labels[k] == v
				}
				if match {
					return a, nil
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return promv1.Alert{}, fmt.Errorf("alert %s%v did not fire within 90 s (last error %v; firing: %v)", name, want, err, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// busyScript keeps Redis busy for ARGV[1] microseconds of its own clock.
const busyScript = `local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1`

// busyRedis runs busyScript for d at a time, back to back, until stopped: every other
// client's round trip waits behind it, as behind any slow command.
func busyRedis(ctx context.Context, t *testing.T, addr string, d time.Duration) (stop func()) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("reaching redis at %s: %v", addr, err)
	}
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for bctx.Err() == nil {
			if err := rdb.Eval(bctx, busyScript, nil, d.Microseconds()).Err(); err != nil && bctx.Err() == nil {
				done <- fmt.Errorf("running the busy script: %w", err)
				return
			}
			time.Sleep(time.Millisecond)
		}
		done <- nil
	}()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		_ = rdb.Close()
	}
}
