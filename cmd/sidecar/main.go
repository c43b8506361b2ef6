// Command sidecar enforces RateLimitPolicies next to an application container: a reverse proxy
// in front of the application, a decision API (POST /v1/check and Envoy's rate limit service),
// health and metrics. See internal/sidecar/app for the flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/redline-dev/redline/internal/sidecar/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := app.Run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}
