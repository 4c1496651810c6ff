package quota

import (
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Slices takes hot keys off Redis: ShouldRateLimit decides through it
// (it wraps the *limiter.Split), and a key whose hits at this instance pass
// Threshold per second (or, warm, WarmThreshold on average: below) gets a
// slice of its limit, leased from the counter itself, from which this
// instance decides the key's hits locally until the slice is used up, goes
// unused a period (a warm key's: its units' time at its rate), or reaches
// the end its algorithm's bound sets (below). A lease is a charge of the counter
// like any hit (limiter.Decide), made before a unit of it is used, so that
// every reader of the counter (the other instances, RLQS fleets, the
// reference's replicas) counts it; a lease that does not fit is not made.
// The slices and the hits Redis decides therefore never pass the limit:
//
//   - sliding_window_log: a slice is recorded at the end of its period, the
//     last instant one of its units can be used (limiter.Hit.Ahead): every
//     window that holds a use holds the slice's members. Exact, at the
//     price of holding the slice's units for one period longer than hits;
//     the period is at most a twentieth of the window.
//   - fixed_window, sliding_window_counter: a slice ends where the window
//     its charge went to ends, so its uses count in that window, as hits at
//     the instant of the charge would: exact for the fixed window, within
//     the counter's own approximation for the sliding one.
//   - gcra: unit k of a slice of n is usable until the start of its
//     emission slot, the TAT the charge left less (n-k) emission intervals:
//     no unit is used later than a hit charged then would be, so the bucket's
//     bound holds (burst plus the limit in any window). Units whose slot has
//     started are dropped unused.
//
// A hot key's slice's size follows this instance's demand on the key (the
// units of its hits in the last second times the period, at least
// minSlice and two hits' cost), and the slice ends after a period unused;
// but a window counter's (fixed_window, sliding_window_counter: their
// slices end with their window at the latest) holds warmSpan of the
// key's demand at least and ends as a warm key's (below), unused: a key at
// ten hits a second pays a lease per hundred hits, not per ten (with warm
// keys off, a period's demand, as the others). A GCRA
// key's slice holds at most the units this instance's hits reach before
// their emission slots start (gcraUsable): all of them at the bucket's
// pace, none slower with the bucket empty.
//
// Warm keys: a key under Threshold whose rate at this instance, averaged
// over about rateTau (ten seconds; see hotKey.rates), reaches
// WarmThreshold gets slices of warmSpan of its demand (at least minSlice
// units and two hits' cost; the log's, minSlice), each ending after the
// time its units take at the key's rate unused (want/rate, by the lower
// of its averages while the key is young: at least a period, at most what
// minSlice units take at the warm threshold), not after a period: a key
// at half a hit a second holds 5 units about 10 s, and one at two a second
// pays a lease per 20 hits where it paid a Redis call per hit. The log's
// slice lives that long at most a twentieth of its window, its period as
// for hot keys (recorded at its end, so the log stays exact), and is not
// leased when that is under two hits' time;
// the counters' and the fixed window's end with their window at the
// latest, as hot keys'. GCRA's warm keys are not leased: their units are
// usable only until their emission slots start, which a key that slow
// would mostly miss. Keys stay tracked while their averaged rate is above
// a quarter of the warm threshold (a key seen once: about 7 s), within
// the bound on tracked keys (SliceOptions.Keys; past it, a new key is
// not tracked and goes to Redis).
//
// Every slice, hot or warm, shrinks with the quota left: at most a quarter
// of what the counter had left at this instance's last store answer of
// it, and never a single unit (it would save nothing). Slices are leased
// only for requests every key of which is hot or warm, ahead of need (a
// hot key's when its slices hold under a quarter of the next or end within
// a quarter of a period, a warm key's when they hold under a quarter of
// the next: none left of minSlice). Unused
// units are given back by the charge's token (limiter.GiveBack: exactly
// the slice's log members, the count of the slice's window) at the tick
// after the slice ends, all of them together; GCRA's are not (the slots
// they held have passed, or are the next charge's), nor a fixed window's
// whose window has ended (no one reads that count again).
//
// What is never leased, and goes to Redis hit by hit as before: shadow and
// quota hits (their answers say what Redis would), recorded costs and
// refunds (a budget's report and a release), checks (cost 0), concurrency
// rules (refund_order: oldest: a slice would hold seats), the reference's
// keys (their window is this instance's clock, not Redis's), and rules
// that opt out (hot_key_slices: false). A request is decided locally only
// when every hit of it is: all or nothing, as on Redis.
type Slices struct {
	ledger    SliceLedger
	threshold float64
	warm      float64 // warm keys' threshold (their rate's); <= 0: off
	period    time.Duration
	perShard  int
	now       func() time.Time
	observe   SliceObserver

	seed   maphash.Seed
	shards [sliceShards]sliceShard

	ctx    context.Context // background work: leases and give backs
	cancel context.CancelFunc
	// returns wait for the next tick, to go to the store together; leases
	// for leaseGather.
	returnsMu sync.Mutex
	returns   []limiter.Return
	leasesMu  sync.Mutex
	leases    []pendingLease
	work      sync.WaitGroup
	// later and spawn start the background work: time.AfterFunc and a
	// goroutine counted in work, but in the simulator (sim_test.go),
	// which owns time and the order of events.
	later  func(time.Duration, func())
	spawn  func(func())
	ticker sync.WaitGroup
	stop   chan struct{}
	once   sync.Once
	closed atomic.Bool
}

// SliceLedger is where slices lease from: the *limiter.Split
// ShouldRateLimit decides with.
type SliceLedger interface {
	Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error)
	GiveBack(ctx context.Context, returns []limiter.Return) (uint64, error)
	Reset(ctx context.Context, h limiter.Hit) (int64, error)
}

// SliceObserver is told what slices do, for metrics. Any field may be nil.
type SliceObserver struct {
	// Local counts hits decided from a slice.
	Local func(hits int)
	// Leased counts a slice leased, of units.
	Leased func(units uint64)
	// GivenBack counts units a slice gave back.
	GivenBack func(units uint64)
	// Keys is the number of keys holding a live slice, every second.
	Keys func(n int)
	// Warm counts a slice leased to a warm key, of units (Leased counts
	// it too).
	Warm func(units uint64)
}

// Defaults where SliceOptions leave a field zero.
const (
	// DefaultSliceThreshold is the hits per second of one key at one
	// instance from which the key is leased.
	DefaultSliceThreshold = 3
	// DefaultSlicePeriod is how long a slice lives (see Slices for the
	// shorter periods of short windows).
	DefaultSlicePeriod = time.Second
	// DefaultSliceKeys bounds the keys whose rate is tracked.
	DefaultSliceKeys = 16384
	// DefaultSliceWarmThreshold is the rate (hits per second, averaged
	// over about rateTau) of one key at one instance from which a key
	// under the threshold is leased small slices that live as long as its
	// rate takes to use them.
	DefaultSliceWarmThreshold = 0.2
)

// rateTau is the time constant of a key's averaged rate: each tick
// (a second) weighs the rate before it by rateDecay and adds its hits by
// 1-rateDecay.
const rateTau = 10 * time.Second

var rateDecay = math.Exp(-float64(time.Second) / float64(rateTau))

// warmForget is the share of the warm threshold under which a key's
// averaged rate lets it be forgotten (when it holds no slice): a key seen
// once is kept about 7 s, long enough to see a key of a fifth of a hit a
// second again.
const warmForget = 0.25

// warmSpan is how much of a warm key's demand its slice holds (but the
// log's, whose slices live at most a twentieth of its window: minSlice),
// and at least how much a hot window counter's does (spansWindow).
// Longer holds more of the limit at this instance for longer; shorter
// costs a lease more often.
const warmSpan = 10 * time.Second

// SliceOptions configure Slices. A nil *SliceOptions means the defaults.
type SliceOptions struct {
	// Threshold is the hits per second of one key at this instance from
	// which the key is leased; zero means DefaultSliceThreshold, a negative
	// value turns slices off (every hit goes to the ledger).
	Threshold float64
	// WarmThreshold is the averaged rate (hits per second over about
	// ten seconds) of one key at this instance from which a key under
	// Threshold is leased warmSpan of its demand at a time (at least
	// minSlice units), its slices ending after the time those units take
	// at its rate; zero means
	// DefaultSliceWarmThreshold, a negative value turns warm keys off (a
	// key is leased only from Threshold, and forgotten after a second
	// without hits).
	WarmThreshold float64
	// Period is a slice's life; zero means DefaultSlicePeriod.
	Period time.Duration
	// Keys bounds the keys tracked at once; zero means DefaultSliceKeys.
	// Past it, a key seen for the first time in a second is not tracked
	// that second.
	Keys int
	// Now is the clock; nil means time.Now. A slice's period and GCRA's
	// unit deadlines are measured on it from the instant its lease was
	// sent, so that Redis's clock, which timed the charge later, is never
	// ahead of them.
	Now func() time.Time
	// Observe is told what slices do.
	Observe SliceObserver
}

const sliceShards = 16

type sliceShard struct {
	mu   sync.Mutex
	keys map[string]*hotKey
}

// hotKey is one tracked key at this instance.
type hotKey struct {
	hits, prev uint32      // hits since the last tick, and in the tick before
	units      uint64      // the units of those hits since the last tick
	prevUnits  uint64      // and in the tick before
	seen       float64     // hits per second, averaged over rateTau at the ticks
	rate       float64     // the same but for the hit that made k tracked (see rates)
	unitRate   float64     // and their units
	weight     float64     // the weight of the ticks since k was tracked: 1 - rateDecay^ticks
	after      uint8       // hits since the one that made k tracked, at most 255
	slices     []*slice    // live, in the order leased
	recorded   []recorded  // the log's ended slices whose members may still be ahead of Redis's now
	leasing    bool        // a lease is on its way
	resets     uint32      // admin Resets of the counter: a lease sent before one is not installed
	retryAt    time.Time   // no lease before (after one refused or failed)
	remaining  uint64      // what the counter had left at the last lease answer
	known      bool        // remaining is known
	answered   time.Time   // when remaining was answered
	rule       limiter.Hit // the hit the slices are of (Cost unset)
}

// recorded is a sliding log's slice that ended, whose members (recorded
// at its period's end) may still be ahead of Redis's now until until: a
// Reset, which keeps the members ahead (other instances' live slices),
// removes this instance's by name.
type recorded struct {
	all   limiter.Return // every unit of the slice
	until time.Time
}

// slice is units of a counter this instance leased.
type slice struct {
	n, used    uint64
	token      int64
	sent       time.Time     // when its lease was sent
	expires    time.Time     // no unit used from then on: where the algorithm's bound ends it
	lastUse    time.Time     // its lease, or the last hit it decided: idle for idle, it ends
	idle       time.Duration // a hot key's period, a warm key's units' time at its rate
	first      time.Time     // GCRA: unit 0's deadline; unit k's is first + k*interval
	interval   time.Duration // GCRA's emission interval; 0 for other algorithms
	remaining  uint64        // the counter's remaining after the lease
	windowEnd  time.Time     // fixed_window: its window has ended in Redis by then; zero otherwise
	resetAfter time.Duration // the counter's reset after the lease
}

// NewSlices returns Slices leasing from ledger. Close stops them.
func NewSlices(ledger SliceLedger, opts *SliceOptions) *Slices {
	return newSlices(ledger, opts, true)
}

// newSlices is NewSlices, whose ticks tests with a frozen clock call by
// hand (turn) when ticking is false.
func newSlices(ledger SliceLedger, opts *SliceOptions, ticking bool) *Slices {
	if opts == nil {
		opts = &SliceOptions{}
	}
	s := &Slices{
		ledger: ledger, threshold: opts.Threshold, warm: opts.WarmThreshold, period: opts.Period, now: opts.Now,
		observe: opts.Observe, seed: maphash.MakeSeed(), stop: make(chan struct{}),
	}
	if s.threshold == 0 {
		s.threshold = DefaultSliceThreshold
	}
	if s.warm == 0 {
		s.warm = DefaultSliceWarmThreshold
	}
	if s.threshold < 0 || s.warm >= s.threshold {
		s.warm = -1 // off: no key is warm short of hot
	}
	if s.period <= 0 {
		s.period = DefaultSlicePeriod
	}
	keys := opts.Keys
	if keys <= 0 {
		keys = DefaultSliceKeys
	}
	s.perShard = max(1, keys/sliceShards)
	if s.now == nil {
		s.now = time.Now
	}
	for i := range s.shards {
		s.shards[i].keys = make(map[string]*hotKey)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.later = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	s.spawn = s.work.Go
	if s.threshold > 0 && ticking {
		s.ticker.Go(s.tick)
	}
	return s
}

// Decide decides hits as the ledger does: from this instance's slices when
// every hit has one with units left, else on the ledger, after which the
// hot keys among them lease a slice in the background.
func (s *Slices) Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error) {
	if s.threshold < 0 || s.closed.Load() || len(hits) == 0 || !s.leasable(hits) {
		return s.ledger.Decide(ctx, hits)
	}
	now := s.now()
	verdicts, hot := s.local(hits, now)
	local := verdicts != nil
	var err error
	if local {
		if s.observe.Local != nil {
			s.observe.Local(len(hits))
		}
	} else {
		verdicts, err = s.ledger.Decide(ctx, hits)
	}
	// Slices are leased ahead of need, and only for a request every hit of
	// which can have one (every key hot or warm): a request that goes to
	// Redis anyway would leave a slice of its hot key unused.
	if hot {
		for i := range hits {
			var v *limiter.Verdict
			if !local {
				v = &verdicts[i]
			}
			s.maybeLease(hits[i], v, now)
		}
	}
	return verdicts, err
}

// leasable reports whether every hit may be decided from a slice, and no
// two share a key (the ledger merges those).
func (s *Slices) leasable(hits []limiter.Hit) bool {
	for i := range hits {
		h := &hits[i]
		if h.NoSlices || h.Shadow || h.Quota || h.Record || h.Refund || h.Lease || h.Settle != "" || h.Cost == 0 ||
			h.Algorithm.ReferenceKeys() || h.Cost > uint64(capacity(*h)) {
			return false
		}
		for j := range i {
			if hits[j].Key == h.Key {
				return false
			}
		}
	}
	return true
}

func (s *Slices) shard(key string) *sliceShard {
	return &s.shards[maphash.String(s.seed, key)%sliceShards]
}

// local decides hits from slices, counting each hit toward its key's rate,
// or returns nil verdicts when one of them has no slice with units enough:
// then nothing was taken. hot reports whether every hit's key is hot or
// warm at this instance (read under the same locks). Shards are locked in order, so that a request of
// several keys takes its units all at once.
func (s *Slices) local(hits []limiter.Hit, now time.Time) (verdicts []limiter.Verdict, hot bool) {
	var ofHit, order [4]int
	shardOf, idx := ofHit[:0], order[:0]
	for i := range hits {
		n := int(maphash.String(s.seed, hits[i].Key) % sliceShards)
		shardOf = append(shardOf, n)
		if !slices.Contains(idx, n) {
			idx = append(idx, n)
		}
	}
	slices.Sort(idx)
	for _, n := range idx {
		s.shards[n].mu.Lock()
	}
	defer func() {
		for _, n := range idx {
			s.shards[n].mu.Unlock()
		}
	}()
	keys := make([]*hotKey, len(hits))
	fits, hot := true, true
	for i := range hits {
		h := &hits[i]
		k := s.shards[shardOf[i]].track(h.Key, s.perShard)
		keys[i] = k
		if k == nil {
			fits, hot = false, false
			continue
		}
		k.hits++
		k.units = saturatingAdd(k.units, h.Cost)
		hot = hot && (s.isHot(k) || s.isWarm(k, h))
		if !k.matches(h) || k.available(now) < h.Cost {
			fits = false
		}
	}
	if !fits {
		return nil, hot
	}
	verdicts = make([]limiter.Verdict, len(hits))
	for i := range hits {
		verdicts[i] = keys[i].take(&hits[i], now)
	}
	return verdicts, hot
}

// isHot reports whether k's hits at this instance in the last second, or
// in the second before, reach the threshold. The caller holds k's shard's
// lock.
func (s *Slices) isHot(k *hotKey) bool {
	return float64(max(k.hits, k.prev)) >= s.threshold
}

// isWarm reports whether k's averaged rate reaches the warm threshold and
// h's algorithm takes warm slices: not GCRA, whose units are usable only
// until their emission slots start, which a key under the threshold would
// mostly miss (its units are then dropped, not given back). The caller
// holds k's shard's lock.
func (s *Slices) isWarm(k *hotKey, h *limiter.Hit) bool {
	if s.warm <= 0 || h.Algorithm == config.GCRA {
		return false
	}
	r, _ := k.rates()
	return r >= s.warm
}

// rates are k's hits and units per second at this instance, averaged over
// about rateTau: its hits at the ticks since it was tracked but the first
// (which made it tracked, and so says nothing of its rate), weighed as
// the ticks were, over the ticks' weight (a key tracked a few seconds ago
// is not taken as idle before). Zero until two hits came after the first:
// a cold key's chance second hit is not a rate. The caller holds k's
// shard's lock.
func (k *hotKey) rates() (hits, units float64) {
	if k.after < 2 || k.weight == 0 {
		return 0, 0
	}
	return k.rate / k.weight, k.unitRate / k.weight
}

// track returns key's state, made if the shard has room; nil otherwise.
// The caller holds the shard's lock.
func (sh *sliceShard) track(key string, most int) *hotKey {
	k := sh.keys[key]
	if k == nil && len(sh.keys) < most {
		k = &hotKey{}
		sh.keys[key] = k
	}
	return k
}

// matches reports whether h is a hit of the rule k's slices are of: a
// reload that changed the rule leaves them to expire unused.
func (k *hotKey) matches(h *limiter.Hit) bool {
	r := &k.rule
	return len(k.slices) > 0 && r.Algorithm == h.Algorithm && r.Limit == h.Limit &&
		r.Window == h.Window && r.Calendar == h.Calendar && r.Burst == h.Burst
}

// available is the units k's live slices hold at now.
func (k *hotKey) available(now time.Time) uint64 {
	var n uint64
	for _, sl := range k.slices {
		n += sl.available(now)
	}
	return n
}

// available is the units sl holds at now; for GCRA it first drops the
// units whose slot has started.
func (sl *slice) available(now time.Time) uint64 {
	if !now.Before(sl.expires) {
		return 0
	}
	if sl.interval > 0 && now.After(sl.first) {
		// Unit k is usable while now <= first + k*interval.
		late := uint64((now.Sub(sl.first) + sl.interval - 1) / sl.interval)
		sl.used = max(sl.used, min(late, sl.n))
	}
	return sl.n - sl.used
}

// take takes h's cost from k's slices, the oldest first, and answers h as
// Redis would have at the last lease, less what this instance used since:
// remaining is what the counter had left after the lease plus the units
// the slices still hold; reset is the lease's, less the time since.
func (k *hotKey) take(h *limiter.Hit, now time.Time) limiter.Verdict {
	need := h.Cost
	var last *slice
	for _, sl := range k.slices {
		if need == 0 {
			break
		}
		got := min(sl.available(now), need)
		sl.used += got
		need -= got
		if got > 0 {
			last, sl.lastUse = sl, now
		}
	}
	// The newest lease's answer counted every older slice's units as used.
	newest := k.slices[len(k.slices)-1]
	left := newest.available(now)
	return limiter.Verdict{
		Admitted:   true,
		Charged:    true,
		Remaining:  min(newest.remaining+left, uint64(capacity(*h))),
		ResetAfter: max(0, last.resetAfter-now.Sub(last.sent)),
	}
}

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
		want = min(want, uint64(capacity(h))/4)
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
		idle = s.warmLife(h, want, lifeRate)
		if !hot && h.Algorithm == config.SlidingWindowLog {
			if lifeRate*idle.Seconds() < 2 {
				// Its life, a twentieth of the window, is under two hits'
				// time: a lease and a give back for a hit or none.
				return
			}
			period = idle // the log's slices end with their period
		}
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
	k.leasing = true
	h.Cost = want
	if h.Algorithm == config.SlidingWindowLog {
		h.Ahead = period
	}
	s.queueLease(pendingLease{hit: h, period: period, idle: idle, warm: !hot, resets: k.resets})
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
	size := uint64(capacity(h))
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
// period and at most what minSlice units take at the warm threshold; the
// log's, as its period, at most a twentieth of its window (its slices hold
// their units one period longer than hits do).
func (s *Slices) warmLife(h limiter.Hit, want uint64, unitRate float64) time.Duration {
	most := max(s.period, time.Duration(float64(minSlice)/s.warm*float64(time.Second)))
	life := most
	if unitRate > 0 {
		life = min(most, time.Duration(float64(want)/unitRate*float64(time.Second)))
	}
	life = max(life, s.period)
	if h.Algorithm == config.SlidingWindowLog {
		life = max(time.Millisecond, min(life, h.Window/20))
	}
	return life
}

// pendingLease is a lease waiting to be sent with the others of its moment.
type pendingLease struct {
	hit    limiter.Hit
	period time.Duration // the log's slices end with it; a failed lease is retried after it
	idle   time.Duration // the slice ends after this long unused
	warm   bool          // of a warm key
	resets uint32        // its key's resets when it was queued
}

// leaseGather is how long a lease waits for others: sent together, they
// share one store call (the batcher takes what is queued), where one by
// one each would be a call of its own. A lease is off the request path:
// the hits meanwhile go to the store.
const leaseGather = 5 * time.Millisecond

// queueLease queues l, and starts the gathering of the leases queued with
// it when it is the first. The caller holds a shard's lock.
func (s *Slices) queueLease(l pendingLease) {
	s.leasesMu.Lock()
	defer s.leasesMu.Unlock()
	s.leases = append(s.leases, l)
	if len(s.leases) == 1 {
		s.work.Add(1)
		s.later(leaseGather, s.sendLeases)
	}
}

// sendLeases sends the queued leases at once, each its own request.
func (s *Slices) sendLeases() {
	defer s.work.Done()
	s.leasesMu.Lock()
	leases := s.leases
	s.leases = nil
	s.leasesMu.Unlock()
	for _, l := range leases {
		s.spawn(func() { s.lease(l) })
	}
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

// ends is when k's last live slice ends.
func (k *hotKey) ends(now time.Time) time.Time {
	end := now
	for _, sl := range k.slices {
		if sl.expires.After(end) {
			end = sl.expires
		}
	}
	return end
}

// lease charges the counter for a slice of l.hit.Cost units and gives it
// to the hit's key.
func (s *Slices) lease(l pendingLease) {
	h, period := l.hit, l.period
	sent := s.now()
	verdicts, err := s.ledger.Decide(s.ctx, []limiter.Hit{h})
	sh := s.shard(h.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[h.Key]
	if k == nil { // dropped by a tick while leasing: keep it, to end the slice
		k = &hotKey{}
		sh.keys[h.Key] = k
	}
	k.leasing = false
	now := s.now()
	if k.resets != l.resets {
		// The counter was reset while the lease was on its way: its
		// charge went to the counter before the reset (gone with it) or
		// after (counted there). Either way its units are not this
		// instance's to spend, nor to give back.
		return
	}
	if err != nil || len(verdicts) != 1 || verdicts[0].FailureVerdict {
		k.retryAt = now.Add(period) // the store failed: the hits say so
		return
	}
	v := verdicts[0]
	if !v.Admitted || !v.Charged {
		k.remaining, k.known, k.answered = v.Remaining, true, now
		k.retryAt = now.Add(min(period, v.ResetAfter))
		return
	}
	sl := &slice{n: h.Cost, token: v.Token, sent: sent, expires: sent.Add(period), lastUse: now, idle: l.idle,
		remaining: v.Remaining, resetAfter: v.ResetAfter}
	switch h.Algorithm {
	case config.FixedWindow:
		sl.expires = sent.Add(v.ResetAfter)
		sl.windowEnd = now.Add(v.ResetAfter) // the charge came before its answer
	case config.SlidingWindowCounter:
		sl.expires = sent.Add(v.ResetAfter - h.Window)
	case config.GCRA:
		// The charge's slots end at the TAT, ResetAfter after the charge
		// (rounded up to the microsecond): unit k's starts (n-k) intervals
		// before it. The interval rounded up, and the charge's time taken
		// as the lease's sending, make every deadline early, never late.
		sl.interval = (h.Window + time.Duration(h.Limit) - 1) / time.Duration(h.Limit)
		sl.first = sent.Add(v.ResetAfter - time.Microsecond - time.Duration(sl.n)*sl.interval)
		sl.expires = sl.first.Add(time.Duration(sl.n-1) * sl.interval).Add(1)
	}
	if !k.matches(&h) {
		k.endAll(s, now) // of another rule, after a reload
		k.rule = h
		k.rule.Cost, k.rule.Ahead = 0, 0
	}
	k.slices = append(k.slices, sl)
	k.remaining, k.known, k.answered = v.Remaining, true, now
	if s.observe.Leased != nil {
		s.observe.Leased(sl.n)
	}
	if l.warm && s.observe.Warm != nil {
		s.observe.Warm(sl.n)
	}
}

// endAll ends every slice of k, giving back what they did not use.
// The caller holds k's shard's lock.
func (k *hotKey) endAll(s *Slices, now time.Time) {
	for _, sl := range k.slices {
		s.giveBack(k, sl, now)
	}
	k.slices = k.slices[:0]
}

// giveBack queues the units sl, a slice of k, did not use to be given back
// at the next tick, with the others', when its algorithm can and they
// still count: GCRA's unused units held slots that have passed or that
// later charges follow; a fixed window's count is dead once its window has
// ended. A log's slice is kept in k.recorded while its members may be
// ahead (its period again past its end, for Redis's clock being ahead of
// this instance's). The caller holds k's shard's lock.
func (s *Slices) giveBack(k *hotKey, sl *slice, now time.Time) {
	rule := k.rule
	if rule.Algorithm == config.SlidingWindowLog {
		k.recorded = append(k.recorded, recorded{
			all:   limiter.Return{Hit: rule, Token: sl.token, Units: sl.n},
			until: sl.expires.Add(sl.expires.Sub(sl.sent)),
		})
	}
	left := sl.n - sl.used
	if sl.interval > 0 || left == 0 {
		return
	}
	sl.used = sl.n
	if !sl.windowEnd.IsZero() && !now.Before(sl.windowEnd) {
		// A fixed window's count is never read once the window has
		// ended: giving units back to it would only cost Redis calls,
		// for every slice of the window at once, at its end.
		return
	}
	s.returnsMu.Lock()
	s.returns = append(s.returns, limiter.Return{Hit: rule, Token: sl.token, Units: left})
	s.returnsMu.Unlock()
}

// returnsPerCall bounds the returns one store call gives back: a call
// holds Redis while it runs, and the decisions waiting behind it have
// Envoy's 20 ms.
const returnsPerCall = 32

// flush gives back the queued returns, returnsPerCall at a time, each
// chunk in one store call per hash slot.
func (s *Slices) flush() {
	s.returnsMu.Lock()
	returns := s.returns
	s.returns = nil
	s.returnsMu.Unlock()
	for chunk := range slices.Chunk(returns, returnsPerCall) {
		n, _ := s.ledger.GiveBack(context.WithoutCancel(s.ctx), chunk) // a failure: the units stay counted
		if n > 0 && s.observe.GivenBack != nil {
			s.observe.GivenBack(n)
		}
	}
}

// tick turns the per-second counts over every second, ends the slices
// whose period is over, and forgets keys that went cold.
func (s *Slices) tick() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.turn(s.now())
			s.flush()
		}
	}
}

// turn is one tick.
func (s *Slices) turn(now time.Time) {
	live := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, k := range sh.keys {
			k.seen = k.seen*rateDecay + float64(k.hits)*(1-rateDecay)
			hits, units := k.hits, k.units
			if k.weight == 0 && hits > 0 { // its first tick: less the first hit
				units -= units / uint64(hits)
				hits--
			}
			k.after = uint8(min(255, uint32(k.after)+hits))
			k.rate = k.rate*rateDecay + float64(hits)*(1-rateDecay)
			k.unitRate = k.unitRate*rateDecay + float64(units)*(1-rateDecay)
			k.weight = k.weight*rateDecay + (1 - rateDecay)
			k.prev, k.hits = k.hits, 0
			k.prevUnits, k.units = k.units, 0
			kept := k.slices[:0]
			for _, sl := range k.slices {
				if sl.expires.After(now) && sl.used < sl.n && now.Sub(sl.lastUse) < sl.idle {
					kept = append(kept, sl)
				} else {
					s.giveBack(k, sl, now)
				}
			}
			clear(k.slices[len(kept):])
			k.slices = kept
			k.recorded = slices.DeleteFunc(k.recorded, func(r recorded) bool { return !r.until.After(now) })
			if len(kept) > 0 {
				live++
			}
			// Without warm keys, a key is forgotten after a second without
			// hits; with them, when its averaged rate is under a share of
			// the warm threshold.
			cold := k.prev == 0
			if s.warm > 0 {
				cold = k.seen < s.warm*warmForget
			}
			if cold && len(kept) == 0 && len(k.recorded) == 0 && !k.leasing {
				delete(sh.keys, key)
			}
		}
		sh.mu.Unlock()
	}
	if s.observe.Keys != nil {
		s.observe.Keys(live)
	}
}

// Close stops leasing, waits for the leases on their way, and gives back
// what every slice did not use (each call bounded by the limiter's
// timeout). Decide goes to the ledger from then on. The ledger is the
// caller's to close, after.
func (s *Slices) Close() {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		s.ticker.Wait()
		// Every shard's lock taken once after closed was set: a lease queued
		// before is counted in work, and none is queued after.
		s.each(func(*hotKey) {})
		s.work.Wait()
		now := s.now()
		s.each(func(k *hotKey) { k.endAll(s, now) })
		s.flush()
		s.cancel()
	})
}

// Reset drops this instance's slices of h's counter, unused units and
// all (the counter they were charged to is going; a log's members with
// them), and a lease of it on its way, and deletes the counter (the admin
// API's Reset). Other instances' slices of it live on: the log keeps their
// members (recorded ahead, see scripts/lua's reset); for the other
// algorithms, what they give back later comes off the new count of the
// same window.
func (s *Slices) Reset(ctx context.Context, h limiter.Hit) (int64, error) {
	sh := s.shard(h.Key)
	sh.mu.Lock()
	var own []limiter.Return // this instance's slices' log members, which the reset would keep
	if k := sh.keys[h.Key]; k != nil {
		for _, r := range k.recorded {
			own = append(own, r.all)
		}
		for _, sl := range k.slices {
			if k.rule.Algorithm == config.SlidingWindowLog {
				own = append(own, limiter.Return{Hit: k.rule, Token: sl.token, Units: sl.n})
			}
		}
		k.slices, k.recorded, k.known = nil, nil, false
		k.resets++ // a lease on its way is not installed
	}
	sh.mu.Unlock()
	if len(own) > 0 {
		if _, err := s.ledger.GiveBack(ctx, own); err != nil {
			return 0, err
		}
	}
	return s.ledger.Reset(ctx, h)
}

// each calls f for every tracked key, under its shard's lock.
func (s *Slices) each(f func(*hotKey)) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, k := range sh.keys {
			f(k)
		}
		sh.mu.Unlock()
	}
}

// saturatingAdd is a + b, at most the largest uint64.
func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
