package envoyrlqs

import (
	"container/heap"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// onResponse is GC onQuotaResponseImpl: each action applied or ignored in
// turn, then one new copy for the workers. The actions are counted once
// published, so that a reader who sees the count sees the assignments.
func (c *Client) onResponse(resp *rlqspb.RateLimitQuotaResponse) {
	c.stats.responses.Add(1)
	var applied, ignored uint64
	for _, a := range resp.GetBucketAction() {
		if c.applyAction(a) {
			applied++
		} else {
			ignored++
		}
	}
	c.publish()
	c.stats.actionsApplied.Add(applied)
	c.stats.actionsIgnored.Add(ignored)
}

// applyAction reports whether Envoy takes a, as GC onQuotaResponseImpl.
func (c *Client) applyAction(a *rlqspb.RateLimitQuotaResponse_BucketAction) bool {
	id := a.GetBucketId().GetBucket()
	if len(id) == 0 {
		return false
	}
	key := bucketKey(id)
	old, ok := c.buckets[key]
	if !ok {
		return false // a bucket Envoy has not created: no assignment ahead of its first report
	}
	next := &cachedBucket{id: old.id, usage: old.usage, from: FromServer, created: old.created}
	switch {
	case a.GetQuotaAssignmentAction() != nil:
		s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
		switch s.GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
		case *typev3.RateLimitStrategy_TokenBucket:
			c.setLimiter(next, old, s.GetTokenBucket())
		default:
			// requests_per_time_unit or no strategy: `continue`, so the old
			// action and its timer stay.
			return false
		}
		next.action = s
	case a.GetAbandonAction() != nil:
		delete(c.buckets, key) // unreported usage goes with it
		return true
	default:
		// Neither: stored without a strategy (F fails open), TTL 0.
		next.action = &typev3.RateLimitStrategy{}
	}
	// GC startActionExpirationTimer: assignment_time_to_live.seconds() only,
	// restarted by every accepted action.
	ttl := secondsOnly(a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds())
	c.buckets[key] = next
	c.startTimer(key, next, ttl, false)
	return true
}

// setLimiter gives next old's limiter when old's action holds a token bucket
// protoTokenBucketsEq calls equal, else a new full one (GC
// shouldReplaceTokenBucket, createTokenBucketFromAction).
func (c *Client) setLimiter(next, old *cachedBucket, tb *typev3.TokenBucket) {
	if prev := old.action.GetTokenBucket(); prev != nil && protoTokenBucketsEq(tb, prev) {
		next.limiter = old.limiter
		return
	}
	next.limiter = newTokenBucket(tb, c.seconds())
	next.created++
}

// protoTokenBucketsEq is GC's: of fill_interval only the nanos are compared,
// so a change of its seconds keeps the old limiter and rate.
func protoTokenBucketsEq(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// onActionExpiration is GC onActionExpirationTimer: to the fallback for its
// timeout, or straight to the default; nothing is abandoned or reported.
func (c *Client) onActionExpiration(key string, cb *cachedBucket) {
	c.stats.expirations.Add(1)
	if c.fallback == nil {
		c.buckets[key] = &cachedBucket{id: cb.id, usage: cb.usage, from: FromDefault, created: cb.created}
		c.publish()
		return
	}
	next := &cachedBucket{id: cb.id, usage: cb.usage, action: c.fallback, from: FromFallback, created: cb.created}
	if tb := c.fallback.GetTokenBucket(); tb != nil {
		c.setLimiter(next, cb, tb)
	}
	c.buckets[key] = next
	c.startTimer(key, next, c.fallbackTTL, true)
	c.publish()
}

// onFallbackExpiration is GC onFallbackExpirationTimer: back to the default.
func (c *Client) onFallbackExpiration(key string, cb *cachedBucket) {
	c.buckets[key] = &cachedBucket{id: cb.id, usage: cb.usage, from: FromDefault, created: cb.created}
	c.publish()
}

// expiry is one armed timer of a cachedBucket. Envoy's timer dies with its
// CachedBucket; here a timer whose bucket was replaced or erased is skipped.
type expiry struct {
	at       time.Time
	key      string
	bucket   *cachedBucket
	fallback bool
}

type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (c *Client) startTimer(key string, cb *cachedBucket, after time.Duration, fallback bool) {
	cb.expires = time.Now().Add(after)
	heap.Push(&c.expiries, expiry{at: cb.expires, key: key, bucket: cb, fallback: fallback})
}

// runExpiries fires the timers due, in order.
func (c *Client) runExpiries() {
	now := time.Now()
	for len(c.expiries) > 0 && !c.expiries[0].at.After(now) {
		e := heap.Pop(&c.expiries).(expiry)
		if c.buckets[e.key] != e.bucket {
			continue
		}
		if e.fallback {
			c.onFallbackExpiration(e.key, e.bucket)
		} else {
			c.onActionExpiration(e.key, e.bucket)
		}
	}
}

func (c *Client) armExpiryTimer() {
	if len(c.expiries) == 0 {
		c.expiryTimer.Stop()
		return
	}
	c.expiryTimer.Reset(time.Until(c.expiries[0].at))
}

func durationSeconds(s int64) *durationpb.Duration {
	return &durationpb.Duration{Seconds: s}
}
