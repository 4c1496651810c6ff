package hotkeys

import (
	"math"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// warmSpan is how much of a warm key's demand its slice holds, and at
// least a hot window counter's (spansWindow): longer holds more of the
// limit here for longer, shorter costs a lease more often.
const warmSpan = 10 * time.Second

// maybeLease starts a lease for h's key when the key is hot or warm here
// and its slices run low: a hot key's under a quarter of the next period's
// need, or ending within a quarter of it; a warm key's under a quarter of
// the next slice (minSlice: none left), as they end with their window, not
// a period. v is the store's verdict of h if it decided h (nil when a slice
// did): what the counter has left, which sizes the next slice.
func (s *Slices) maybeLease(h limiter.Hit, v *limiter.Verdict, now time.Time) {
	sh := s.shard(h.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[h.Key]
	if k == nil || s.closed.Load() { // read under the lock: Close takes every shard's after setting it
		return
	}
	if v != nil && !v.FailureVerdict && !v.CostExceedsLimit {
		k.remaining, k.known, k.answered = v.Remaining, true, now
	}
	if k.leasing || now.Before(k.retryAt) {
		return
	}
	hot := s.isHot(k)
	if !hot && !s.isWarm(k, &h) {
		return
	}
	units := float64(max(k.units, k.prevUnits)) // in the last second
	period := s.periodOf(h)
	spans := s.warm > 0 && spansWindow(h.Algorithm) // their life is a warm key's, which needs the warm threshold
	// Sized in units, the hits' costs: at least two hits' worth.
	want := max(minSlice, 2*h.Cost)
	hitRate, unitRate := k.rates()
	if hot {
		want = max(want, uint64(math.Ceil(units*period.Seconds())))
	}
	if spans {
		want = max(want, uint64(math.Ceil(unitRate*warmSpan.Seconds())))
	}
	// A window counter's slices end with their window (see lease): one
	// leased now ends with the live ones, and holds what the key's rate
	// uses until then, no more (a fixed window's unused units die with it;
	// a sliding counter's go back to a window counted ever less).
	windowEnd := now
	if spansWindow(h.Algorithm) && k.matches(&h) {
		windowEnd = k.ends(now)
	}
	if windowEnd.After(now) {
		rest := uint64(math.Ceil(max(units, unitRate) * windowEnd.Sub(now).Seconds()))
		want = min(want, max(minSlice, 2*h.Cost, rest))
	}
	if k.known {
		want = min(want, k.remaining/4)
	} else {
		want = min(want, uint64(h.Capacity())/4)
	}
	if h.Algorithm == config.GCRA {
		want = min(want, gcraUsable(h, k.remaining, k.known, now.Sub(k.answered), units, k.available(now)))
	}
	if want < 2 { // a slice of one saves nothing
		return
	}
	idle := period
	if !hot || spans {
		lifeRate := unitRate
		if k.seen < hitRate {
			// Young, the rate from a few hits can run high, and k.seen
			// (every hit, over ticks at none before tracking) low: the
			// slice lives the longer, lest a quick start end it early.
			lifeRate *= k.seen / hitRate
		}
		idle = s.warmLife(want, lifeRate)
	}
	if hot {
		// A window counter's slices end with the window, as a new one would.
		endsSoon := !spansWindow(h.Algorithm) && !k.ends(now).After(now.Add(period/4))
		if k.matches(&h) && k.available(now) >= want/4 && !endsSoon {
			return
		}
	} else if k.matches(&h) && k.available(now) >= max(1, want/4) {
		return
	}
	life := period // the log's and GCRA's slices end with their period
	if spansWindow(h.Algorithm) {
		life = windowLeft(&h, windowEnd, now)
	}
	if !pays(k, &h, want, life, s.hitsToPay) {
		return
	}
	k.leasing = true
	k.seenRemaining, k.seenTAT = math.MaxUint64, time.Time{} // see rebase
	h.Cost = want
	h.Ahead = period // a slice: see limiter.Hit.Ahead
	s.queueLease(pendingLease{hit: h, period: period, idle: idle, warm: !hot, resets: k.resets, landed: make(chan struct{})})
}

// sliceHitsToPay is how many hits a slice must be expected to decide for
// its lease: the lease and its give back cost the store about two hits'
// calls, and a slice deciding fewer than twice that costs more than it
// saves (a per-second window at a few hits a second; a short log's slice).
const sliceHitsToPay = 4.0

// pays reports whether a slice of want units of h's key, living life, is
// expected to decide at least hitsToPay hits, at the key's rate and cost.
func pays(k *hotKey, h *limiter.Hit, want uint64, life time.Duration, hitsToPay float64) bool {
	hitRate, unitRate := k.rates()
	// The last second's count (the hot threshold's) when the key is too
	// young for an average or the count jumps: such a key is leased at
	// once. Not a count within chance of the average (at 1.5 hits a second,
	// 5 in a second now and then): its slice would decide a hit or two.
	if last := float64(max(k.hits, k.prev)); hitRate == 0 || last > jumpFrom(hitRate) {
		hitRate = last
		unitRate = max(unitRate, float64(max(k.units, k.prevUnits)))
	}
	if hitRate <= 0 {
		return false
	}
	perHit := max(unitRate/hitRate, float64(h.Cost), 1)
	return min(float64(want)/perHit, hitRate*life.Seconds()) >= hitsToPay
}

// jumpFrom is the most hits in one second that chance gives a key hit at
// random at rate a second (Poisson: the rate, three standard deviations,
// and two more for a small rate); a count above it is a jump.
func jumpFrom(rate float64) float64 { return rate + 3*math.Sqrt(rate) + 2 }

// windowLeft is how long a window counter's slice leased now lives at most:
// until its window ends (windowEnd when the key has live slices, else the
// window's own end; a calendar window's, months, is taken as its length).
func windowLeft(h *limiter.Hit, windowEnd, now time.Time) time.Duration {
	if windowEnd.After(now) {
		return windowEnd.Sub(now)
	}
	if !h.Calendar.IsZero() {
		return h.Window
	}
	// Windows start at whole multiples of their length since the Unix
	// epoch (time.Truncate counts from year 1: another alignment).
	w := h.Window.Microseconds()
	return time.UnixMicro((now.UnixMicro()/w + 1) * w).Sub(now)
}

// gcraUsable is how many units of a GCRA slice of h this instance can use
// at rate (units per second) before their slots start (unit k's, k
// intervals after the time the bucket was ahead of now when leased): all
// at the bucket's pace or faster, slower the first ones only, none from
// an empty bucket (docs/reliability.md, "Hot keys"). remaining is the
// bucket's at the last answer, since ago, and held the units this
// instance's live slices hold (used first). The time ahead is taken low,
// erring toward smaller slices: a unit less than remaining says, less the
// time since, the lease's wait and the held units' time.
func gcraUsable(h limiter.Hit, remaining uint64, known bool, since time.Duration, rate float64, held uint64) uint64 {
	if rate*h.Window.Seconds() >= float64(h.Limit) { // not rate*interval >= 1: it rounds under 1 at the pace
		return math.MaxUint64
	}
	if !known || rate <= 0 || h.Limit == 0 {
		return 0
	}
	interval := h.Window.Seconds() / float64(h.Limit)
	size := uint64(h.Capacity())
	ahead := float64(size-min(remaining, size))*interval - interval - since.Seconds() - leaseGather.Seconds() - float64(held)/rate
	n := ahead / (1/rate - interval)
	if !(n > 0) { // NaN included
		return 0
	}
	if n >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(n)
}

// spansWindow reports whether slices of alg's counters hold warmSpan of a
// key's demand, hot or warm: those ending with their window at the latest
// (fixed_window, sliding_window_counter). The log's (periodOf) and GCRA's
// (gcraUsable) hold a period's demand.
func spansWindow(alg config.Algorithm) bool {
	return alg == config.FixedWindow || alg == config.SlidingWindowCounter
}

// warmLife is how long a warm key's slice of want units lives unused: the
// time want units take at the key's averaged rate of units, at least a
// period and at most what minSlice units take at the warm threshold.
func (s *Slices) warmLife(want uint64, unitRate float64) time.Duration {
	most := max(s.period, time.Duration(float64(minSlice)/s.warm*float64(time.Second)))
	life := most
	if unitRate > 0 {
		life = min(most, time.Duration(float64(want)/unitRate*float64(time.Second)))
	}
	return max(life, s.period)
}

// minSlice is the fewest units a slice is leased with, quota allowing: a
// key just past the threshold leases a few seconds of its demand at once.
const minSlice = 4

// periodOf is the period of h's slices: the log's is at most a twentieth
// of its window, as its slices hold their units one period longer than
// hits do (at most 5 % of the limit at a time).
func (s *Slices) periodOf(h limiter.Hit) time.Duration {
	if h.Algorithm == config.SlidingWindowLog {
		return max(time.Millisecond, min(s.period, h.Window/20))
	}
	return s.period
}
