package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// The route matrix: request targets against five guarded routes, an Exact /login, a prefix
// /api/v1/orders, a GET-only /search, a POST-only /admin and a /report that the application
// serves on any method but the rule counts for GET, each guarded by a rule of its own. Every target that reaches a guarded route through the proxy must be counted by that
// route's rule, whatever spelling of the method or path the application's router accepts.

// routeTarget is one request of the matrix, as sent on the wire.
type routeTarget struct{ method, target string }

var routeTargets = []routeTarget{
	{"GET", "/login"}, {"HEAD", "/login"}, {"get", "/login"}, {"POST", "/login"}, {"PUT", "/login"},
	{"GET", "/login/"}, {"GET", "/LOGIN"}, {"GET", "/Login/"}, {"GET", "/login;jsessionid=1"},
	{"GET", "//login"}, {"GET", "/./login"}, {"GET", "/x/../login"}, {"GET", "/x/%2e%2e/login"},
	{"GET", "/%6Cogin"}, {"GET", "http://shop/login"}, {"GET", "/login%2F"}, {"GET", "/login?next=/"},
	{"GET", "/api/v1/orders"}, {"GET", "/api/v1/orders/"}, {"GET", "/api/v1/orders/7"}, {"DELETE", "/api/v1/orders/7"},
	{"GET", "/API/V1/Orders/7"}, {"GET", "/api/v1/orders;v=1/7"}, {"GET", "/api//v1/orders/7"},
	{"GET", "/api/v1/x/../orders/7"}, {"GET", "/api/v1/%6Frders/7"}, {"GET", "/api/v1/ordersx"},
	{"GET", "/search"}, {"HEAD", "/search"}, {"get", "/search"}, {"GET", "/search/"}, {"GET", "/SEARCH"},
	{"GET", "/search;a=b"}, {"POST", "/search"},
	{"POST", "/admin"}, {"post", "/admin"}, {"POST", "/admin/"}, {"POST", "/Admin"}, {"POST", "/admin;x=1"},
	{"GET", "/admin"}, {"OPTIONS", "/admin"},
	{"GET", "/report"}, {"get", "/report"}, {"Get", "/report"}, {"HEAD", "/report"},
}

// routePrimers are a request each guarded route's rule counts, named by route.
var routePrimers = map[string]routeTarget{
	"login": {"GET", "/login"}, "orders": {"GET", "/api/v1/orders/1"}, "search": {"GET", "/search"}, "admin": {"POST", "/admin"},
	"report": {"GET", "/report"},
}

// routeRules are the four rules, one unit a minute per X-Req value; routerOptions sets the
// path options the guide gives for the router.
func routeRules(ignoreCase, ignoreTrailingSlash bool) []policydoc.Rule {
	rule := func(name string, m policydoc.Match) policydoc.Rule {
		m.IgnoreCase = ignoreCase
		if m.ExactPath != "" {
			m.IgnoreTrailingSlash = ignoreTrailingSlash
		}
		return policydoc.Rule{
			Name: name, Match: &m, Key: []policydoc.KeyPart{{Header: "x-req"}}, Algorithm: "FixedWindow",
			Requests: 1, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce",
		}
	}
	return []policydoc.Rule{
		rule("login", policydoc.Match{ExactPath: "/login"}),
		rule("orders", policydoc.Match{PathPrefix: "/api/v1/orders"}),
		rule("search", policydoc.Match{ExactPath: "/search", Methods: []string{"GET"}}),
		rule("admin", policydoc.Match{ExactPath: "/admin", Methods: []string{"POST"}}),
		rule("report", policydoc.Match{ExactPath: "/report", Methods: []string{"GET"}}),
	}
}

// sendRaw sends one request as written, through a connection of its own, and returns the
// status and the route (X-Route) that served it.
func sendRaw(t *testing.T, addr string, tg routeTarget, id string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: shop\r\nX-Req: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", tg.method, tg.target, id); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: strings.ToUpper(tg.method)})
	if err != nil {
		t.Fatalf("%s %s: %v", tg.method, tg.target, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Route")
}

// runRouteMatrix sends every target through a proxy to upstream in two passes, each with a
// fresh key: the first learns which route (if any) serves it, the second spends that route's
// rule first and expects the target refused. It returns the targets that reached a guarded
// route uncounted, and how many reached one.
func runRouteMatrix(t *testing.T, upstream string, rules []policydoc.Rule) (uncounted []string, served int) {
	t.Helper()
	front, _ := startProxy(t, upstream, func(o *proxy.Options) {
		o.Engine = &decide.Engine{Limiter: sidecartest.Limiter(t)}
		o.Store = sidecartest.StoreOf(t, sidecartest.DocumentRules("ns", "p", "web", rules...))
		o.Headers = false
	})
	addr := front.Listener.Addr().String()
	for i, tg := range routeTargets {
		status, route := sendRaw(t, addr, tg, fmt.Sprintf("learn-%d", i))
		if status == http.StatusTooManyRequests {
			t.Fatalf("%s %s refused with a fresh key", tg.method, tg.target)
		}
		if route == "" || status/100 != 2 {
			continue
		}
		served++
		id := fmt.Sprintf("spent-%d", i)
		primer := routePrimers[route]
		if st, r := sendRaw(t, addr, primer, id); st/100 != 2 || r != route {
			t.Fatalf("%s %s, which the %s rule counts: status %d, route %q", primer.method, primer.target, route, st, r)
		}
		if st, _ := sendRaw(t, addr, tg, id); st != http.StatusTooManyRequests {
			uncounted = append(uncounted, fmt.Sprintf("%s %s (route %s, status %d)", tg.method, tg.target, route, st))
		}
	}
	return uncounted, served
}

// goRouter is a Go ServeMux with the matrix's routes; with pathParameters, it first strips
// each segment's ";" path parameters, as Tomcat, Jetty and Spring do. Every route names
// itself in X-Route and counts what it served.
func goRouter(pathParameters bool) (http.Handler, func() map[string]int) {
	mux := http.NewServeMux()
	var mu sync.Mutex
	counts := map[string]int{}
	route := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			counts[name]++
			mu.Unlock()
			w.Header().Set("X-Route", name)
			_, _ = io.WriteString(w, "served "+name+"\n")
		}
	}
	mux.HandleFunc("/login", route("login"))
	mux.HandleFunc("/api/v1/orders/", route("orders"))
	mux.HandleFunc("GET /search", route("search"))
	mux.HandleFunc("POST /admin", route("admin"))
	mux.HandleFunc("/report", route("report"))
	served := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(counts)
	}
	if !pathParameters {
		return mux, served
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		segs := strings.Split(r.URL.Path, "/")
		for i, s := range segs {
			segs[i], _, _ = strings.Cut(s, ";")
		}
		r.URL.Path, r.URL.RawPath = strings.Join(segs, "/"), ""
		mux.ServeHTTP(w, r)
	}), served
}

// A Go ServeMux (case-sensitive, strict about a trailing slash) and a router that strips
// path parameters as Tomcat does need no path option: the sidecar counts HEAD with GET,
// methods in any case, and refuses a path with a ";".
func TestRouteMatrixGoRouters(t *testing.T) {
	for _, tc := range []struct {
		name           string
		pathParameters bool
	}{{"ServeMux", false}, {"Tomcat-style, path parameters stripped", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h, served := goRouter(tc.pathParameters)
			up := httptest.NewServer(h)
			t.Cleanup(up.Close)
			uncounted, reached := runRouteMatrix(t, up.Listener.Addr().String(), routeRules(false, false))
			t.Logf("%s: %d of %d targets reached a guarded route, %d of them uncounted", tc.name, reached, len(routeTargets), len(uncounted))
			if len(uncounted) > 0 {
				t.Errorf("reached a guarded route uncounted:\n%s", strings.Join(uncounted, "\n"))
			}
			for r := range routePrimers {
				if served()[r] == 0 {
					t.Errorf("route %s served nothing: %v", r, served())
				}
			}
		})
	}
}

// A real Express 5 with its default router settings (case-insensitive, not strict about a
// trailing slash) needs ignoreCase on every path and trailingSlash: Ignore on exact ones;
// without them, spellings it routes pass uncounted.
func TestRouteMatrixExpress(t *testing.T) {
	addr := startExpress(t)
	t.Run("with the options the guide gives", func(t *testing.T) {
		uncounted, served := runRouteMatrix(t, addr, routeRules(true, true))
		t.Logf("Express 5, ignoreCase and trailingSlash Ignore: %d of %d targets reached a guarded route, %d of them uncounted", served, len(routeTargets), len(uncounted))
		if len(uncounted) > 0 {
			t.Errorf("reached a guarded route uncounted:\n%s", strings.Join(uncounted, "\n"))
		}
	})
	t.Run("without them", func(t *testing.T) {
		uncounted, served := runRouteMatrix(t, addr, routeRules(false, false))
		t.Logf("Express 5, no path options: %d of %d targets reached a guarded route, %d of them uncounted:\n%s", served, len(routeTargets), len(uncounted), strings.Join(uncounted, "\n"))
		if len(uncounted) == 0 {
			t.Error("every target was counted without the options: the options the guide gives are not needed")
		}
	})
}

// startExpress installs the locked Express 5 of testdata/express into a directory of the
// test's (npm ci: the registry, or npm's cache) and runs the application with Node; it
// returns the address it listens on. A missing Node or npm, or an unreachable registry,
// fails the test.
func startExpress(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("the Express upstream needs Node.js (apt-get install nodejs npm): %v", err)
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("the Express upstream needs npm (apt-get install npm): %v", err)
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "app.js"} {
		data, err := os.ReadFile(filepath.Join("testdata", "express", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	install := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("installing Express 5 with npm ci (is the npm registry reachable?): %v\n%s", err, out)
	}
	cmd := exec.Command(node, "app.js")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PORT=0")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	port, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("the Express application did not start: %q, %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return net.JoinHostPort("127.0.0.1", port)
}

// A key on the Path or Method attribute takes the request's path and method as the rule's
// match compares them: spellings the rule counts as one path (another case, a trailing slash)
// or one method (HEAD for GET, a lower-case method) share one key, not a key each.
func TestPathAndMethodKeysFollowTheMatch(t *testing.T) {
	byPath := policydoc.Rule{
		Name: "by-path", Match: &policydoc.Match{ExactPath: "/login", IgnoreCase: true, IgnoreTrailingSlash: true},
		Key: []policydoc.KeyPart{{Attribute: "Path"}}, Algorithm: "FixedWindow", Requests: 1, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce",
	}
	byMethod := policydoc.Rule{
		Name: "by-method", Match: &policydoc.Match{ExactPath: "/search", Methods: []string{"GET"}},
		Key: []policydoc.KeyPart{{Attribute: "Method"}}, Algorithm: "FixedWindow", Requests: 1, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce",
	}
	h, _ := goRouter(false)
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	front, _ := startProxy(t, up.Listener.Addr().String(), func(o *proxy.Options) {
		o.Engine = &decide.Engine{Limiter: sidecartest.Limiter(t)}
		o.Store = sidecartest.StoreOf(t, sidecartest.DocumentRules("ns", "p", "web", byPath, byMethod))
	})
	addr := front.Listener.Addr().String()
	for _, step := range []struct {
		tg      routeTarget
		refused bool
	}{
		{routeTarget{"GET", "/Login/"}, false},
		{routeTarget{"GET", "/login"}, true},
		{routeTarget{"GET", "/LOGIN"}, true},
		{routeTarget{"HEAD", "/search"}, false},
		{routeTarget{"GET", "/search"}, true},
		{routeTarget{"get", "/search"}, true},
	} {
		if st, _ := sendRaw(t, addr, step.tg, "k"); (st == http.StatusTooManyRequests) != step.refused {
			t.Errorf("%s %s: status %d, refused should be %v", step.tg.method, step.tg.target, st, step.refused)
		}
	}
}
