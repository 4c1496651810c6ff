// Package decision holds what the service asks of the deciders layered
// over the limiter (internal/regions, internal/hotkeys): a limiter.Hit
// with what those layers read of its rule, which the limiter never sees.
package decision

import (
	"context"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Hit is a limiter.Hit with how the layers over the limiter route it.
type Hit struct {
	limiter.Hit
	// Global marks a hit of a global rule (config.Rule.Global): the
	// regions' decider sets its Limit to the region's allowance.
	Global *config.Global
	// NoSlices keeps the hit off the slices of hot keys: decided on the
	// store every time, as a rule with hot_key_slices: false, a
	// concurrency rule or a global rule asks.
	NoSlices bool
}

// Decider decides a request's hits, one verdict per hit in their order.
type Decider interface {
	Decide(ctx context.Context, hits []Hit) ([]limiter.Verdict, error)
}

// Store is what decides the limiter's hits: a *limiter.Limiter or a
// *limiter.Split.
type Store interface {
	Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error)
}

// Direct decides hits on store, with nothing layered between.
func Direct(store Store) Decider { return direct{store} }

type direct struct{ store Store }

func (d direct) Decide(ctx context.Context, hits []Hit) ([]limiter.Verdict, error) {
	return d.store.Decide(ctx, LimiterHits(hits))
}

// LimiterHits returns the limiter's hits of hits, in their order.
func LimiterHits(hits []Hit) []limiter.Hit {
	out := make([]limiter.Hit, len(hits))
	for i := range hits {
		out[i] = hits[i].Hit
	}
	return out
}
