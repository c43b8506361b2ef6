package limiter_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// Replicas reserving and settling one key at once, each request using a random amount (more
// than its hold, sometimes): Redis counts exactly what the requests used, and never admitted a
// hold past the limit except by the debts it recorded.
func TestHoldExactness(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		const replicas, callers, rounds, limit = 3, 8, 40, 500
		lim := holdLimit(alg, limit)
		key := uniqueKey(t)
		var ls []*limiter.Limiter
		for range replicas {
			ls = append(ls, newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), PrecheckSize: -1}))
		}
		// The model lags Redis on both sides (a hold counts once Reserve returned, a settle's
		// units leave before it is sent and its use counts once it returned), so it never
		// counts more than Redis did; Redis never counts more than the limit plus its debts.
		var mu sync.Mutex
		var open, usedTotal, debt, reserved int64
		var wg sync.WaitGroup
		for i := range replicas * callers {
			l := ls[i%replicas]
			wg.Go(func() {
				ctx := context.Background()
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				for range rounds {
					least := 1 + rng.Int64N(10)
					_, h, err := l.Reserve(ctx, key, lim, least, least+rng.Int64N(40), time.Hour)
					if err != nil {
						t.Error(err)
						return
					}
					if h == nil {
						continue
					}
					mu.Lock()
					open += h.Units
					reserved++
					if open+usedTotal > limit+debt {
						t.Errorf("held %d and used %d past the limit %d and debts %d", open, usedTotal, limit, debt)
					}
					open -= h.Units
					mu.Unlock()
					used := rng.Int64N(h.Units * 3 / 2)
					s, err := l.Settle(ctx, h, used)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					usedTotal += used
					debt += s.Debt
					mu.Unlock()
					if s.Expired || s.Returned+used-s.Debt != h.Units {
						t.Errorf("settle of %d with %d used: %+v", h.Units, used, s)
					}
				}
			})
		}
		wg.Wait()
		g.Expect(reserved).To(BeNumerically(">", 10))
		for _, l := range ls {
			g.Expect(l.Stats().RestoredUnits).To(BeZero(), "no share counted more than Redis")
		}
		g.Expect(counted(t, newClient(t, shared.URL()), key, lim)).To(Equal(usedTotal))
		t.Logf("%d holds, %d units used, %d of them debt", reserved, usedTotal, debt)
	})
}
