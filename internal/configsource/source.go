// Package configsource delivers the rate limit config to the service: the
// config to start with, then each update and each rejection, whichever
// place it comes from. Two sources implement it: File (a file or directory,
// watched for changes) and XDS (an xDS server, as envoyproxy/ratelimit's
// GRPC_XDS_SOTW). A new source implements Source; the service's assembly
// (internal/app) wires whichever the settings name and knows no other.
package configsource

import (
	"context"

	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Sink is what a source delivers to once the service runs: in practice
// *service.Service.
type Sink interface {
	// Reload puts c in force and reports whether it differs from the
	// config in force (sources resend unchanged configs: a watcher on
	// every write, an xDS server on every new stream).
	Reload(c *config.Config) bool
	// ReloadFailed reports a config the source refused: the one in force
	// stays.
	ReloadFailed(err error)
}

// Source is where the config comes from. Its methods are called in this
// order: First, then Follow (once), then Close.
type Source interface {
	// First returns the config to start with, waiting for it as long as
	// the source must; nil and no error when ctx ends first (a stop
	// before the start).
	First(ctx context.Context) (*config.Config, error)
	// Follow hands every later config and rejection to sink, from the
	// moment it returns (it does not block) until ctx ends or Close. A
	// source that cannot go on logs why: the config in force then stays
	// until a restart.
	Follow(ctx context.Context, sink Sink)
	// Configured reports whether a config has arrived: false only while
	// a source that started without one (XDSOptions.ForceStart) waits for
	// its first, when rate limit calls must fail rather than pass.
	Configured() bool
	// Close stops the source, waits for its background work and frees
	// what it holds.
	Close() error
}

// logWarnings logs what a config holds that loads but has no effect.
func logWarnings(log *zap.Logger, cfg *config.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("config: "+w, zap.String("hash", cfg.Hash()))
	}
}
