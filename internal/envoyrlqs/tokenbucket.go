package envoyrlqs

import (
	"math"
	"sync/atomic"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// minFillRate is TB's kMinFillRate: one token a year, the floor of every rate.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// tokenBucket is TB's AtomicTokenBucketImpl (folly's design): the bucket is
// one time, in seconds, from which the tokens are the time passed since it
// times the rate, capped; taking a token moves the time forward.
type tokenBucket struct {
	maxTokens float64
	fillRate  float64
	since     atomic.Uint64 // float64 bits: seconds on the client's clock
}

// newTokenBucket is GC createTokenBucketFromAction with TB's constructor
// (init_fill true): full at now. The rate divides by the whole seconds of
// fill_interval (absl::ToInt64Seconds truncates), so under 1 s it is +Inf
// (or NaN with tokens_per_fill 0), which admits everything.
func newTokenBucket(tb *typev3.TokenBucket, now float64) *tokenBucket {
	rate := float64(tb.GetTokensPerFill().GetValue()) / float64(wholeSeconds(tb.GetFillInterval().GetSeconds(), tb.GetFillInterval().GetNanos()))
	b := &tokenBucket{maxTokens: float64(tb.GetMaxTokens()), fillRate: cppMax(math.Abs(rate), minFillRate)}
	b.since.Store(math.Float64bits(now - b.maxTokens/b.fillRate))
	return b
}

// consume takes one token at now (seconds), as TB consume(): never at or
// before the bucket's time, and only a whole token.
func (b *tokenBucket) consume(now float64) bool {
	for {
		oldBits := b.since.Load()
		old := math.Float64frombits(oldBits)
		if now <= old {
			return false
		}
		total := cppMin(b.maxTokens, (now-old)*b.fillRate)
		if total < 1 {
			return false
		}
		if b.since.CompareAndSwap(oldBits, math.Float64bits(now-(total-1)/b.fillRate)) {
			return true
		}
	}
}

// remaining is TB remainingTokens at now.
func (b *tokenBucket) remaining(now float64) float64 {
	return cppMin(b.maxTokens, (now-math.Float64frombits(b.since.Load()))*b.fillRate)
}

// cppMin and cppMax are std::min and std::max, whose NaN handling (the first
// argument unless the comparison holds) the bucket's edges depend on;
// math.Min and math.Max return NaN instead.
func cppMin(a, b float64) float64 {
	if b < a {
		return b
	}
	return a
}

func cppMax(a, b float64) float64 {
	if a < b {
		return b
	}
	return a
}

// wholeSeconds is absl::ToInt64Seconds of a Duration proto: truncated toward
// zero.
func wholeSeconds(seconds int64, nanos int32) int64 {
	switch {
	case seconds > 0 && nanos < 0:
		return seconds - 1
	case seconds < 0 && nanos > 0:
		return seconds + 1
	}
	return seconds
}

// secondsOnly is how GC reads assignment_time_to_live and F reads
// expired_assignment_behavior_timeout: the seconds field, nanos dropped; a
// negative one arms a timer that fires at once.
func secondsOnly(seconds int64) time.Duration {
	if seconds <= 0 {
		return 0
	}
	if seconds > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(seconds) * time.Second
}
