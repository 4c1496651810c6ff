// Package decision holds what the service asks of the deciders layered
// over the limiter (internal/regions, internal/hotkeys): a request's
// limiter hits and, beside them, what those layers read of each hit's
// rule, which the limiter never sees.
package decision

import (
	"context"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Request is a request's hits, in order and as the limiter takes them, and
// how the layers over it route each: Routes[i] is Hits[i]'s; nil routes none.
type Request struct {
	Hits   []limiter.Hit
	Routes []Route
}

// Route is how the layers over the limiter route a hit.
type Route struct {
	// Global marks a hit of a global rule (config.Rule.Global): the
	// regions' decider sets its Limit to the region's allowance.
	Global *config.Global
	// NoSlices decides the hit on the store every time, off hot keys'
	// slices: hot_key_slices: false, concurrency and global rules ask it.
	NoSlices bool
}

// Route returns hit i's route.
func (r Request) Route(i int) Route {
	if r.Routes == nil {
		return Route{}
	}
	return r.Routes[i]
}

// Decider decides a request's hits, one verdict per hit in their order.
type Decider interface {
	Decide(ctx context.Context, req Request) ([]limiter.Verdict, error)
}

// Store decides the limiter's hits: a *limiter.Limiter or *limiter.Split.
type Store interface {
	Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error)
}

// Direct decides hits on store, with nothing layered between.
func Direct(store Store) Decider { return direct{store} }

type direct struct{ store Store }

func (d direct) Decide(ctx context.Context, req Request) ([]limiter.Verdict, error) {
	return d.store.Decide(ctx, req.Hits)
}
