package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

var sharesScript = redis.NewScript(lua.RLQSShares())

// ShareRequest asks for one Envoy's part of a limit (RLQS): the registry at
// Key holds every live member's demand and assignment on one counter.
type ShareRequest struct {
	// Key is the registry key: the counter's key in this service's schema
	// followed by ":rlqs", so that both share a cluster slot.
	Key string
	// Member is the Envoy stream's id.
	Member string
	// Demand is the units per Window the Envoy asks for; < 0 (or NaN) is
	// unknown (its first report) and asks for the whole Limit, so that the
	// member gets an equal share.
	Demand float64
	// Limit is the units per Window the whole fleet may take.
	Limit uint64
	// Window is the limit's window, whole seconds.
	Window time.Duration
	// Current is the T the member holds now (0: none); a new share close to
	// it keeps it (see Share), since Envoy restarts a changed token bucket
	// full.
	Current uint64
	// ReportInterval is R, Envoy's reporting period: the bucket's size is
	// about one R of refill, M = max(1, ceil(T * min(R, W) / W)).
	ReportInterval time.Duration
	// Lease is how long the assignment lives: the member's entry ends Lease
	// after Redis TIME now, and the registry expires 2*Lease after the last
	// report (or at the latest lease end).
	Lease time.Duration
}

// Share is the member's part of the limit.
type Share struct {
	// Tokens is T, the units per Window granted (0: none left).
	Tokens uint64
	// MaxTokens is M, the token bucket's size for Tokens (0 when Tokens is 0).
	MaxTokens uint64
	// Lookahead is the units the OTHER live members' buckets may still
	// refill before their leases end: ceil(sum of T * (lease end - now) /
	// Window). A bucket's first fill (M) is not leased.
	Lookahead uint64
}

// Share records r's demand in its registry and decides the member's share:
// the max-min fair share of Limit among the live members' demands (members
// whose lease ended are dropped), rounded up and at least 1, kept at
// Current when at most a fifth below it (leaving the others their fair
// shares) or at most 5 % above it, and capped so that the T the members
// hold never sum past Limit, whatever the order of the calls: a member's
// entry keeps the larger of Current and its new share until ConfirmShare
// says the new one was sent, or its next call. A Limit of 0 has
// nothing to share: Share answers Share{} without a store call.
//
// Like Reset it runs one atomic script (EVALSHA, re-sent with EVAL on
// NOSCRIPT) within the limiter's timeout, and is observed like every store
// call (Options.Observe). A failure wraps ErrStore; a bad request (empty
// Key or Member, a Window not whole seconds, a Lease under a second, a
// ReportInterval not positive) is an error that does not.
func (l *Limiter) Share(ctx context.Context, r ShareRequest) (Share, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return Share{}, ErrClosed
	}
	if err := checkShare(r); err != nil {
		return Share{}, fmt.Errorf("share: %w", err)
	}
	if r.Limit == 0 {
		return Share{}, nil
	}
	n, err := l.numbers(ctx, "share", sharesScript, r.Key, []any{
		r.Member, demandArg(r.Demand, r.Limit), r.Limit, r.Window.Milliseconds(),
		r.Current, r.ReportInterval.Milliseconds(), r.Lease.Milliseconds(),
	}, 3)
	if err != nil {
		return Share{}, err
	}
	return Share{Tokens: n[0], MaxTokens: n[1], Lookahead: n[2]}, nil
}

// demandArg is a demand as the share scripts read it: -1 when unknown (< 0
// or NaN), at most limit (+Inf too: the scripts read no "+Inf").
func demandArg(demand float64, limit uint64) string {
	switch {
	case math.IsNaN(demand) || demand < 0:
		demand = -1
	case demand > float64(limit):
		demand = float64(limit)
	}
	return strconv.FormatFloat(demand, 'f', -1, 64)
}

// numbers runs s on key with args within the limiter's timeout, observed
// like every store call, and reads its reply of n whole numbers. A failure
// wraps ErrStore; what names the call in the error.
func (l *Limiter) numbers(ctx context.Context, what string, s *redis.Script, key string, args []any, n int) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	reply, err := l.script(ctx, s, []string{key}, args).StringSlice()
	l.observe(time.Since(start), err)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrStore, what, err)
	}
	if len(reply) != n {
		return nil, fmt.Errorf("%w: %s: reply %q, want %d numbers", ErrStore, what, reply, n)
	}
	out := make([]uint64, n)
	for i, v := range reply {
		if out[i], err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: %s: reply %q: %w", ErrStore, what, reply, err)
		}
	}
	return out, nil
}

func checkShare(r ShareRequest) error {
	switch {
	case r.Key == "":
		return errors.New("empty key")
	case r.Member == "":
		return errors.New("empty member")
	case r.Window < time.Second || r.Window%time.Second != 0:
		return fmt.Errorf("window %v is not whole seconds", r.Window)
	case r.Lease < time.Second:
		return fmt.Errorf("lease %v is under a second", r.Lease)
	case r.ReportInterval < time.Millisecond:
		return fmt.Errorf("report interval %v is under a millisecond", r.ReportInterval)
	}
	return nil
}

var confirmScript = redis.NewScript(lua.RLQSConfirm())

// ConfirmShare lowers member's entry in the registry at key to tokens, the
// share it was sent, once sent: Share keeps the larger of a member's old
// and new T until told the new one is on its way, so that what it gives up
// goes to no one while it may still hold it. window is the limit's (Split
// routes by it). Like Share it is one atomic script within the limiter's
// timeout, observed; a failure wraps ErrStore. An entry that has expired,
// or holds no more than tokens, is left as it is.
func (l *Limiter) ConfirmShare(ctx context.Context, key, member string, window time.Duration, tokens uint64) error {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return ErrClosed
	}
	if key == "" || member == "" {
		return errors.New("confirm share: empty key or member")
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	err := l.script(ctx, confirmScript, []string{key}, []any{member, tokens}).Err()
	l.observe(time.Since(start), err)
	if err != nil {
		return fmt.Errorf("%w: confirm share: %w", ErrStore, err)
	}
	return nil
}
