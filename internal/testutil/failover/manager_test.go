package failover

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// parseFlagDefaults reads what Go's flag package prints for -help: a duration, a quoted
// string, a string with spaces and parentheses, a flag without a default, a boolean.
func TestParseFlagDefaults(t *testing.T) {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.Duration("script-check-interval", time.Second, "How often (every node, replicas included) it checks.")
	fs.String("redis-tenant-acl", "auto", "Per-namespace users: auto (an ACL user), required or off.")
	fs.String("spaced", "a (b) c", "A default with parentheses.")
	fs.String("empty", "", "No default.")
	fs.Bool("leader-elect", false, "Elect a leader.")
	fs.Int("port", 9443, "Port,\nover two lines.")
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	got := parseFlagDefaults(b.String())
	for name, want := range map[string]string{
		"script-check-interval": "1s", "redis-tenant-acl": "auto", "spaced": "a (b) c", "empty": "", "leader-elect": "", "port": "9443",
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("-%s: got %q (listed: %t), want %q\nusage:\n%s", name, v, ok, want, b.String())
		}
	}
}
