package topkeys

import (
	"fmt"
	"testing"
)

// What the decision path adds per decision of a long window (Use, 16 keys kept, 1,000 keys
// seen) and per slot taken and given back (Hold twice, 1,000 keys holding).
func BenchmarkUsageUse(b *testing.B) {
	var u Usage
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("%032x", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			u.Use(keys[i%len(keys)], "", uint64(i), 0, 1, int64(i))
		}
	})
}

func BenchmarkHoldersHold(b *testing.B) {
	var h Holders
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("%032x", i)
		h.Hold(keys[i], "", 1)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			k := keys[i%len(keys)]
			h.Hold(k, "", 1)
			h.Hold(k, "", -1)
		}
	})
}
