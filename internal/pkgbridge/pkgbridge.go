// Package pkgbridge lets the public packages under pkg/ hand each other the
// internal values their types wrap, without exporting them: pkg/config sets
// ConfigOf and pkg/limiter sets LimiterOf in their init, and pkg/service reads
// them. It is the pattern of grpc-go's own internal package. Nothing else uses
// it.
package pkgbridge

import (
	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// ConfigOf returns the internal config a *pkg/config.Config wraps.
var ConfigOf func(any) *config.Config

// LimiterOf returns the internal limiter a *pkg/limiter.Limiter wraps.
var LimiterOf func(any) *limiter.Limiter
