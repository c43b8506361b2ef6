package decide

import (
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/topkeys"
)

// useQuota records what a long window's key has used of its period, from a decision Redis
// answered (or the pre-check's refusal: the key is at its limit). No Redis call is added: the
// count is the limit less what the script said remains. A lease's local decisions say nothing
// of the shared count and are left out; the next call to Redis for the key says it again (and
// counts the units leased out as used). A calendar period is named by its end, which the
// calendar computes from the instant Redis said the window resets, so that replicas name it
// alike whatever their clocks. A decision without a period (the pre-check's) is named by this
// sidecar's clock.
func useQuota(t *topkeys.Tracker, lim limiter.Limit, hash, label string, res limiter.Result) {
	if hash == "" || res.Source != limiter.SourceRedis && res.Source != limiter.SourcePrecheck {
		return
	}
	used := uint64(max(lim.Requests-max(res.Remaining, 0), 0))
	now := time.Now().UnixMilli()
	var start, end int64
	if lim.Calendar != nil {
		// now+ResetAfter is the period's end, give or take the time since Redis decided and
		// the two clocks' skew: it can fall just past the boundary. Half a period before it is
		// surely inside the period Redis decided in.
		at := now
		if res.Period > 0 {
			at += (res.ResetAfter - res.Period/2).Milliseconds()
		}
		start, end = lim.Calendar.PeriodMS(at)
	}
	t.Quota.Use(hash, label, used, start, end, now)
}
