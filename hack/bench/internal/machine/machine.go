// Package machine reads what the benchmark commands report about the machine and the Redis they
// measure: the load average, and a redis-server's own CPU time.
package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// LoadAverage is the 1, 5 and 15 minute load averages from /proc/loadavg, or "unknown".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// RedisCPU is the server's CPU time so far, user and system (used_cpu_user + used_cpu_sys of
// INFO cpu).
func RedisCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total float64
	found := 0
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, errors.New("INFO cpu has no used_cpu_sys and used_cpu_user")
	}
	return time.Duration(total * float64(time.Second)), nil
}
