package fleettest

import "runtime"

// Allocation is what fn allocates in this process (TotalAlloc) and what of it is still held
// when it returns (HeapAlloc after a GC, fn's result kept alive). Anything else running in the
// process (a manager beside a test) counts too, so both are upper bounds.
func Allocation(fn func() any) (total, held uint64) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v := fn()
	runtime.ReadMemStats(&after)
	total = after.TotalAlloc - before.TotalAlloc
	runtime.GC()
	runtime.ReadMemStats(&after)
	if after.HeapAlloc > before.HeapAlloc {
		held = after.HeapAlloc - before.HeapAlloc
	}
	runtime.KeepAlive(v)
	return total, held
}

// MiB is n bytes in MiB, for logs.
func MiB(n uint64) float64 { return float64(n) / (1 << 20) }
