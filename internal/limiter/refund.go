package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// refundScript undoes the charges of a request denied across cluster slots.
var refundScript = redis.NewScript(lua.Refund())

// All or nothing across Redis Cluster slots is this refund, not one atomic
// call: a script's keys must share a slot, and the slots of a request live
// on masters that no transaction spans. Each slot's group is decided
// atomically at once (decide.lua), and when the whole request turns out
// denied the charges are undone by the tokens decide.lua returned, which
// name the very charge (the log's members, the counter's window): exact,
// where a Refund hit would give back to whatever window is current. Split
// cannot do the same across its two stores (see Split.giveBack): the
// tokens stay inside each Limiter.

// owesBack reports whether hit h, with verdict v, made a charge to take back
// when its request turns out denied. A recorded cost was spent whatever the
// request's fate, and a refund is always applied: neither is taken back.
// The Cluster refund and Split.giveBack share it, with takeBack.
func owesBack(h *Hit, v *Verdict) bool { return v.Charged && !h.Record && !h.Refund }

// takeBack says in v, the verdict of h, that its charge was given back: not
// charged, and the cost remaining again.
func takeBack(h *Hit, v *Verdict) {
	v.Charged, v.Token = false, 0
	v.Remaining = min(v.Remaining+h.Cost, uint64(h.capacity()))
}

// refund takes back, in the background, the charges of a request that was
// denied, so that its answer waits for no more than its deadline. The
// verdicts say uncharged at once; until the refund lands (one round trip)
// other requests can see the charge. The refund has a deadline of its own
// and outlives the caller's cancellation. A charge that cannot be taken back
// stays counted until its window forgets it; the failure reaches Observe.
func (l *Limiter) refund(ctx context.Context, hits []Hit, groups [][]int, verdicts []Verdict, tokens []int64) {
	ctx = context.WithoutCancel(ctx)
	for _, group := range groups {
		var keys []string
		var args []any
		for _, i := range group {
			h, v := &hits[i], &verdicts[i]
			if !owesBack(h, v) {
				continue
			}
			var err error
			if args, err = refundArgs(args, h, tokens[i]); err != nil {
				continue // Decide refused the hit already
			}
			keys = append(keys, h.Key)
			takeBack(h, v)
		}
		if len(keys) == 0 {
			continue
		}
		l.refunds.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, l.timeout)
			defer cancel()
			start := time.Now()
			err := l.script(ctx, refundScript, keys, args).Err()
			if err != nil {
				err = fmt.Errorf("%w: refund of a request denied across slots: %w", ErrStore, err)
			}
			l.observe(time.Since(start), err)
		})
	}
}

// GiveBack undoes units of a charge of h that token (its Verdict's) names:
// exactly the members of the log's charge, the counters' count of the
// charge's window (never another window's), GCRA's TAT by units' time
// (never past now). A slice of a hot key gives back what it did not use
// this way (internal/quota's Slices). It returns the units given back, and
// drops the deny cache's entry of the counter. A failure wraps ErrStore.
func (l *Limiter) GiveBack(ctx context.Context, h Hit, token int64, units uint64) (uint64, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	if units == 0 {
		return 0, nil
	}
	h.Cost = units
	args, err := refundArgs(nil, &h, token)
	if err != nil {
		return 0, fmt.Errorf("give back: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	n, err := l.script(ctx, refundScript, []string{h.Key}, args).Int64()
	l.observe(time.Since(start), err)
	if err != nil {
		return 0, fmt.Errorf("%w: give back: %w", ErrStore, err)
	}
	if l.denied != nil {
		l.denied.forget(h.Key)
	}
	return uint64(max(n, 0)), nil
}
