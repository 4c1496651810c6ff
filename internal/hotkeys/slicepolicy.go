package hotkeys

import (
	"math"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Which keys get a slice, when, and how large: the policy, apart from the
// lease (slicelease.go), which holds whatever it asks for to the limit.

// warmSpan is how much of a warm key's demand its slice holds, and at
// least how much a hot window counter's does (spansWindow).
// Longer holds more of the limit at this instance for longer; shorter
// costs a lease more often.
const warmSpan = 10 * time.Second

// maybeLease starts a lease for h's key when the key is hot or warm at
// this instance and its slices run low. A hot key's slices run low under a
// quarter of what the next period needs, or ending within a quarter of it;
// a warm key's when they hold under a quarter of the next slice (minSlice:
// none left), as its slices end with their window rather than with a
// period. v is the store's verdict of h when it decided h (nil when a
// slice did): what the counter has left, which sizes the next slice.
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
	_, unitRate := k.rates()
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
		hits, _ := k.rates()
		lifeRate := unitRate
		if k.seen < hits {
			// Young, the rate from a few hits can run high; the average
			// of every hit, first included, over the ticks at no hit
			// before the key was tracked runs low: the slice's life is
			// the longer of the two, lest a quick start end it early.
			lifeRate *= k.seen / hits
		}
		idle = s.warmLife(want, lifeRate)
	}
	if hot {
		// Ending within a quarter of a period, its slices run low; a window
		// counter's end with the window, as a new one would.
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
// its lease: the lease's call and its give back cost the store about what
// two hits' calls do, and a slice that decides fewer than twice that
// costs more than it saves (a per-second window at a few hits a second, a
// log's slice of a short window's twentieth).
const sliceHitsToPay = 4.0

// pays reports whether a slice of want units of h's key, living life, is
// expected to decide at least hitsToPay hits (sliceHitsToPay unless the
// options say): at the key's rate, and within its units at the key's cost
// per hit.
func pays(k *hotKey, h *limiter.Hit, want uint64, life time.Duration, hitsToPay float64) bool {
	hitRate, unitRate := k.rates()
	// The last second's count, as the hot threshold reads it, when the key
	// is too young for an average or the count is a jump: a key whose rate
	// jumps is leased at once, not when its average catches up. A count
	// within chance of the average (a key at 1.5 hits a second sees 5 in
	// one second now and then) is not: such a slice decides a hit or two
	// and costs what several do.
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

// jumpFrom is the most hits in one second that chance gives a key whose
// hits come at random at rate a second (Poisson: the rate and three of its
// standard deviations, and two more for a small rate); a count above it is
// a jump in the key's rate.
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
// at rate (units per second) before their emission slots start, the
// bucket having had remaining units left at the last answer, since ago,
// and this instance's live slices holding held units (used first). Unit k
// of a slice is usable until its slot starts, k emission intervals after
// the time the bucket was ahead of now when leased: at the bucket's pace
// or faster every unit is reached in time; slower, the first ones only,
// and none when the bucket was empty: the rest would be dropped, holding
// the bucket for nothing. The time ahead is taken low (a unit less than
// the answer's remaining says, less the time since, the lease's wait and
// the held units' time), so that the estimate errs toward smaller slices.
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
// key's demand, hot or warm: those whose slices end with their window at
// the latest (fixed_window, sliding_window_counter). The log's slices hold
// their units a period longer than hits do, and GCRA's units are usable
// only until their emission slots start: theirs hold a period's demand.
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

// minSlice is the fewest units a slice is leased with, when the quota
// left allows: a key just past the threshold then leases a few seconds of
// its demand at once.
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
