// Package limiter decides rate limits on Redis. It knows nothing of gRPC or
// Envoy: it takes hits (a key, an algorithm, a limit, a window, a cost) and
// answers, per hit, whether it fits, what is left and when the limit frees up.
//
// Every decision runs as one atomic Lua script (see scripts/lua) with Redis
// TIME as the clock, sent with EVALSHA and transparently re-sent with EVAL
// when Redis answers NOSCRIPT (after a restart, a failover or SCRIPT FLUSH).
package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// DefaultTimeout bounds a store call when Options do not say. It stays below
// Envoy's default 20 ms rate limit filter timeout, so that the rule's
// failure_mode answers a slow store rather than Envoy's own failure mode.
const DefaultTimeout = 15 * time.Millisecond

// Hit asks whether Cost more units fit Limit per Window on the counter Key.
type Hit struct {
	// Key is the store key, built with KeyBuilder.
	Key string
	// Algorithm decides how the window slides.
	Algorithm config.Algorithm
	// Limit is the number of units the window admits.
	Limit uint32
	// Window is the length of the window, a whole number of seconds.
	Window time.Duration
	// Cost is the number of units this hit consumes; 0 checks without
	// consuming.
	Cost uint64
	// Shadow marks a hit that is evaluated and accounted as usual, but whose
	// denial does not deny the request.
	Shadow bool
}

// Verdict is the answer for one Hit.
type Verdict struct {
	// Admitted reports that the hit fits its limit.
	Admitted bool
	// Charged reports that the hit's cost was recorded. An admitted hit is
	// not charged when another enforced hit of the same request was denied.
	Charged bool
	// CostExceedsLimit reports a hit whose cost is larger than its limit:
	// it can never be admitted, so it was denied without asking the store.
	CostExceedsLimit bool
	// Remaining is the number of units still available after this decision.
	Remaining uint64
	// ResetAfter is, for an admitted hit, the time until the window is
	// empty again; for a denied hit, the time until its cost would fit,
	// provided nothing else arrives meanwhile.
	ResetAfter time.Duration
}

// Options configure a Limiter. A nil *Options means the defaults.
type Options struct {
	// Timeout bounds every store call; zero means DefaultTimeout.
	Timeout time.Duration
}

// Limiter decides hits against a Redis store. It is safe for concurrent use.
type Limiter struct {
	store   redis.Scripter
	script  *redis.Script
	timeout time.Duration
}

// New returns a Limiter on store. go-redis's *Client, *ClusterClient and
// UniversalClient all satisfy redis.Scripter.
func New(store redis.Scripter, opts *Options) *Limiter {
	l := &Limiter{store: store, script: redis.NewScript(lua.Decide), timeout: DefaultTimeout}
	if opts != nil && opts.Timeout > 0 {
		l.timeout = opts.Timeout
	}
	return l
}

// ErrStore wraps every failure to get an answer from the store (unreachable,
// timed out, or an unexpected reply), so callers can apply failure modes.
var ErrStore = errors.New("rate limit store")

// Decide decides the hits of one request atomically: when any enforced hit
// does not fit, none is charged (all or nothing). The returned verdicts are
// in the order of hits. On error (wrapping ErrStore) no verdict is returned
// and nothing is known to have been charged.
func (l *Limiter) Decide(ctx context.Context, hits []Hit) ([]Verdict, error) {
	verdicts := make([]Verdict, len(hits))
	charge := true
	keys := make([]string, 0, len(hits))
	args := make([]any, 1, 1+5*len(hits))
	sent := make([]int, 0, len(hits))
	for i, h := range hits {
		if h.Cost > uint64(h.Limit) {
			// Never admissible: answer at once, without a store write.
			verdicts[i] = Verdict{CostExceedsLimit: true, ResetAfter: h.Window}
			if !h.Shadow {
				charge = false
			}
			continue
		}
		keys = append(keys, h.Key)
		args = append(args, algorithmID(h.Algorithm), h.Limit, h.Window.Microseconds(), h.Cost, flag(h.Shadow))
		sent = append(sent, i)
	}
	if len(keys) == 0 {
		return verdicts, nil
	}
	args[0] = flag(charge)

	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	reply, err := l.script.Run(ctx, l.store, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("%w: decide: %w", ErrStore, err)
	}
	if len(reply) != 4*len(keys) {
		return nil, fmt.Errorf("%w: decide: %d values in reply, want %d", ErrStore, len(reply), 4*len(keys))
	}
	for j, i := range sent {
		r := reply[4*j : 4*j+4]
		verdicts[i] = Verdict{
			Admitted:   r[0] == 1,
			Charged:    r[1] == 1,
			Remaining:  uint64(max(r[2], 0)),
			ResetAfter: time.Duration(r[3]) * time.Microsecond,
		}
	}
	return verdicts, nil
}

// algorithmID is the algorithm's index in decide.lua's table.
func algorithmID(a config.Algorithm) int {
	switch a {
	case config.SlidingWindowLog:
		return 1
	case config.FixedWindow:
		return 3
	default:
		return 2
	}
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
