package limiter

import (
	"sync"
	"sync/atomic"
	"time"
)

// denyCache remembers, briefly, the hits Redis denied, so that a client
// hammering a full counter is answered without a store call. It only ever
// denies, and only what Redis would deny: a hit on the same key with the
// same limit and at least the denied cost, before the wait Redis announced.
// Capacity freed in ways this instance cannot see (a refund across cluster
// slots, an admin Reset on another instance) could make a cached denial
// wrong, so entries live at most maxAge: the error is bounded, and towards
// denying.
type denyCache struct {
	maxAge     time.Duration
	maxEntries int64
	entries    sync.Map // key to denial
	size       atomic.Int64
}

// denial is a verdict Redis gave.
type denial struct {
	limit     uint32
	cost      uint64
	remaining uint64
	fitsAt    time.Time // when the cost fits again, by Redis's own wait
	expires   time.Time // when the entry stops answering: fitsAt or maxAge
}

func newDenyCache(maxAge time.Duration) *denyCache {
	return &denyCache{maxAge: maxAge, maxEntries: 100_000}
}

// lookup answers h from the cache, if it holds a denial that covers it.
func (c *denyCache) lookup(h Hit, now time.Time) (Verdict, bool) {
	e, ok := c.entries.Load(h.Key)
	if !ok {
		return Verdict{}, false
	}
	d := e.(denial)
	if !now.Before(d.expires) || d.limit != h.Limit || h.Cost < d.cost {
		return Verdict{}, false
	}
	return Verdict{Remaining: d.remaining, ResetAfter: d.fitsAt.Sub(now)}, true
}

// remember keeps a denial decided for a call sent at sent: measuring the
// wait from before Redis ran it, never after, keeps the entry on the safe
// side of Redis's clock.
func (c *denyCache) remember(h Hit, v Verdict, sent time.Time) {
	fitsAt := sent.Add(v.ResetAfter)
	expires := sent.Add(c.maxAge)
	if fitsAt.Before(expires) {
		expires = fitsAt
	}
	d := denial{limit: h.Limit, cost: h.Cost, remaining: v.Remaining, fitsAt: fitsAt, expires: expires}
	if _, loaded := c.entries.Swap(h.Key, d); !loaded && c.size.Add(1) > c.maxEntries {
		// A bound, not an eviction policy: past it, start over.
		c.entries.Clear()
		c.size.Store(0)
	}
}

// forget drops what the cache knows of key (after a Reset).
func (c *denyCache) forget(key string) {
	if _, loaded := c.entries.LoadAndDelete(key); loaded {
		c.size.Add(-1)
	}
}
