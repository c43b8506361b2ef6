package stack

import (
	"testing"

	. "github.com/onsi/gomega"
)

func TestContainerRewriteArg(t *testing.T) {
	rc := &Container{
		Volumes: map[string]string{"/tmp/k8s-webhook-server/serving-certs": "/work/certs"},
		Ports:   map[int32]int{8080: 41000, 8081: 41001, 9443: 41002},
	}
	for _, tc := range []struct{ in, want string }{
		{"--metrics-bind-address=:8080", "--metrics-bind-address=127.0.0.1:41000"},
		{"--health-probe-bind-address=0.0.0.0:8081", "--health-probe-bind-address=127.0.0.1:41001"},
		{"--webhook-port=9443", "--webhook-port=41002"}, // a bare port stays a bare port
		{"--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs", "--webhook-cert-dir=/work/certs"},
		{"--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs-x", "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs-x"},
		{"--redis-maxclients=10000", "--redis-maxclients=10000"},
		{"--leader-elect", "--leader-elect"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			NewWithT(t).Expect(rc.rewriteArg(tc.in)).To(Equal(tc.want))
		})
	}
}

func TestEnvRefExpandsKubeletStyle(t *testing.T) {
	g := NewWithT(t)
	g.Expect(envRef.FindAllStringSubmatch("--redis-url=$(REDLINE_REDIS_URL) $(A_1)", -1)).To(Equal([][]string{
		{"$(REDLINE_REDIS_URL)", "REDLINE_REDIS_URL"}, {"$(A_1)", "A_1"},
	}))
	g.Expect(envRef.MatchString("$REDLINE_REDIS_URL")).To(BeFalse(), "kubelet expands only $(VAR)")
}

func TestExpandEnvRefsAsKubelet(t *testing.T) {
	g := NewWithT(t)
	env := []string{"REDLINE_REDIS_TLS_SERVER_NAME=orders.internal", "EMPTY=", "WITH_EQ=a=b"}
	g.Expect(expandEnvRefs([]string{
		"--redis-tls-server-name=$(REDLINE_REDIS_TLS_SERVER_NAME)",
		"--empty=$(EMPTY)",
		"--eq=$(WITH_EQ)",
		"--undefined=$(NOT_SET)",
	}, env)).To(Equal([]string{
		"--redis-tls-server-name=orders.internal",
		"--empty=",
		"--eq=a=b",
		"--undefined=$(NOT_SET)",
	}), "an undefined reference stays as written")
}
