package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

func readyz(t *testing.T, s *sidecar) (int, string) {
	t.Helper()
	resp, err := http.Get(s.admin + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz of %s: %v", s.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A sidecar counts in its pod's namespace, never in one a document names: a document of
// another namespace (a tenant's own redline-policies ConfigMap saying namespace: victim) is
// refused, counted and logged, and the set in force stays.
func TestSidecarRefusesAnotherNamespacesDocument(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document("victim", "p", "r", "web", 5, time.Hour, "x-key", "Closed"))
	up := newUpstream(t)
	s := start(t, "pod-0", e, shared.URL(), up.addr(), false)

	code, body := readyz(t, s)
	g.Expect(code).To(Equal(http.StatusServiceUnavailable))
	g.Expect(body).To(ContainSubstring("another namespace"))
	g.Expect(s.metric(t, "redline_sidecar_config_reload_errors_total")).To(BeNumerically(">=", 1))
	g.Expect(s.Log()).To(ContainSubstring(`policies document names another namespace than the pod's: document \"victim\", pod \"` + e.namespace))

	// Its own namespace's document loads; the victim's, written again, is refused and the
	// set in force stays.
	own := sidecartest.Document(e.namespace, "p", "r", "web", 5, time.Hour, "x-key", "Closed")
	e.write(t, own)
	g.Eventually(func() int { c, _ := readyz(t, s); return c }).WithTimeout(20 * time.Second).Should(Equal(http.StatusOK))
	_, inForce := readyz(t, s)
	errorsBefore := s.metric(t, "redline_sidecar_config_reload_errors_total")
	e.write(t, sidecartest.Document("victim", "p", "r", "web", 1000, time.Hour, "x-key", "Open"))
	g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_config_reload_errors_total") }).
		WithTimeout(20 * time.Second).Should(BeNumerically(">", errorsBefore))
	_, now := readyz(t, s)
	g.Expect(now).To(Equal(inForce), "the last good set stays in force")

	// Decisions count in the pod's namespace only.
	key := fmt.Sprint("ns-", time.Now().UnixNano())
	for range 3 {
		d, err := check(httpClient, s, `{"policy":"p","rule":"r","key":["`+key+`"]}`)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(d.Allowed).To(BeTrue())
	}
	c := redisclient.New(t, shared.URL(), redisconn.Options{})
	g.Expect(c.Exists(context.Background(), keyscheme.Key("victim", "p", "r", key)+":swl").Val()).To(BeZero())
	g.Expect(c.Exists(context.Background(), fleet.GroupKey("victim", "p")).Val()).To(BeZero(), "no heartbeat in the victim's group")
}

// A sidecar works under its namespace's own Redis user, read from the mounted Secret: it
// decides (leases included), heartbeats, survives Redis losing its scripts once the manager
// loads them again (it may not load them itself), and keeps deciding across a password
// rotation, including on connections it opens after the old password is gone.
func TestSidecarUnderItsTenantUser(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	srv, err := redistest.Start("--requirepass", "admin-secret")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	admin := redisclient.New(t, srv.URL(), redisconn.Options{Password: "admin-secret"})
	loadScripts := func() {
		for _, s := range redisacl.SidecarScripts() {
			g.Expect(admin.ScriptLoad(ctx, s.Source).Err()).To(Succeed())
		}
	}
	loadScripts()

	e := newEnv(t, "web")
	nodes := []redisacl.Node{admin}
	g.Expect(redisacl.Ensure(ctx, nodes, e.namespace, []string{"pw-1"})).To(Succeed())
	creds := filepath.Join(t.TempDir(), "redis")
	writeCreds := func(pw string) {
		g.Expect(kubeletdir.Write(creds, map[string][]byte{
			contract.RedisUsernameKey: []byte(redisacl.Username(e.namespace)), contract.RedisSecretKey: []byte(pw),
		})).To(Succeed())
	}
	writeCreds("pw-1")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1000000, time.Hour, "x-key", "Closed", "FixedWindow"))
	up := newUpstream(t)
	s := start(t, "pod-0", e, srv.URL(), up.addr(), true, "--"+contract.FlagRedisCredentialsDir+"="+creds)

	n := 0
	decide := func() string {
		n++
		d, err := check(httpClient, s, fmt.Sprintf(`{"policy":"p","rule":"r","key":["k-%d"]}`, n))
		g.Expect(err).NotTo(HaveOccurred())
		return d.Results[0].Source
	}
	// Leases: one hot key, many decisions, most from the lease.
	sources := map[string]int{}
	for range 200 {
		d, err := check(httpClient, s, `{"policy":"p","rule":"r","key":["hot"]}`)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(d.Allowed).To(BeTrue())
		sources[d.Results[0].Source]++
	}
	g.Expect(sources).To(HaveKey("redis"))
	g.Expect(sources).To(HaveKey("lease"))
	g.Expect(sources).To(HaveLen(2), "decided in Redis or from leases only: %v", sources)
	g.Expect(decide()).To(Equal("redis"))
	g.Eventually(func() map[string]string {
		m, _ := fleet.Members(ctx, admin, e.namespace, "p", fleet.TTL(500*time.Millisecond))
		return m
	}).WithTimeout(10*time.Second).Should(HaveKey("pod-0"), "its heartbeat is recorded")
	g.Expect(s.metric(t, "redline_sidecar_heartbeat_errors_total")).To(BeZero())

	// Redis loses its scripts: the sidecar may not load them (NOPERM), so its failure mode
	// decides until the manager loads them again; then Redis decides again.
	g.Expect(admin.ScriptFlush(ctx).Err()).To(Succeed())
	g.Eventually(decide).WithTimeout(10 * time.Second).Should(Equal("failclosed"))
	loadScripts()
	g.Eventually(decide).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal("redis"))

	// Rotation as the controller does it: both passwords, the Secret, then the new alone.
	g.Expect(redisacl.Ensure(ctx, nodes, e.namespace, []string{"pw-1", "pw-2"})).To(Succeed())
	writeCreds("pw-2")
	g.Expect(redisacl.Ensure(ctx, nodes, e.namespace, []string{"pw-2"})).To(Succeed())
	g.Expect(decide()).To(Equal("redis"), "connections opened with the old password stay authenticated")
	// Every connection of the user closed: the next ones dial with what the files hold now.
	g.Expect(admin.Do(ctx, "client", "kill", "user", redisacl.Username(e.namespace)).Err()).To(Succeed())
	g.Eventually(decide).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal("redis"))
	for range 20 {
		g.Expect(decide()).To(Equal("redis"))
	}
	list, err := admin.ClientList(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list).To(ContainSubstring("user=" + redisacl.Username(e.namespace)))
	g.Expect(strings.Count(list, "name="+contract.RedisClientName)).To(BeNumerically(">=", 1), "CLIENT SETNAME is allowed")
}
