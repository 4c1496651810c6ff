// Command ratelimit is a rate limit service for Envoy with sliding windows on
// Redis. See the README and docs/ for its flags and config; internal/app assembles it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/slidingwindow/ratelimit/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal starts the drain, a second one kills.
		<-ctx.Done()
		stop()
	}()
	if err := app.Main(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}
