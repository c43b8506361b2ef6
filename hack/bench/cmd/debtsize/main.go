// Command debtsize measures the memory of the refusals the Envoy face remembers (the in-flight
// registry's and the hold registry's MaxOwed): each registry filled to its bound with
// refusals of keys of their own, on keys as short as they come and as long as a tenant's names
// make them (a 63-character namespace, a 253-character policy and a 63-character rule), the
// live heap measured after a collection.
//
// Usage: go run ./cmd/debtsize (from hack/bench).
package main

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/sidecar/decide"
)

func main() {
	short := func(i int) string { return keyscheme.Key("ns", "p", "r", strconv.Itoa(i)) }
	long := func(i int) string {
		return keyscheme.Key(strings.Repeat("n", 63), strings.Repeat("p", 253), strings.Repeat("r", 63), strconv.Itoa(i))
	}
	fmt.Println("| registry | refusals | key length | heap | bytes a refusal |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, k := range []struct {
		name string
		key  func(int) string
	}{{"short", short}, {"long", long}} {
		measure("in-flight", decide.MaxOwed, k.key, func(n int, key func(int) string) any {
			g := &decide.SlotRegistry{Lease: time.Hour}
			for i := range n {
				g.Owe(key(i))
			}
			return g
		})
		measure("hold", decide.MaxOwed, k.key, func(n int, key func(int) string) any {
			g := &decide.Registry{}
			for i := range n {
				g.Owe(key(i), time.Hour)
			}
			return g
		})
	}
}

// measure fills a registry with n refusals of keys of their own and prints its live heap.
func measure(name string, n int, key func(int) string, fill func(int, func(int) string) any) {
	before := liveHeap()
	reg := fill(n, key)
	after := liveHeap()
	runtime.KeepAlive(reg)
	grew := after - before
	fmt.Printf("| %s | %d | %d | %.1f MiB | %d |\n", name, n, len(key(0)), float64(grew)/(1<<20), grew/uint64(n))
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
