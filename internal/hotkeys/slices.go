// Package hotkeys decides hot keys at a service instance from slices
// leased from their counters (Slices: slices.go decides, slicepolicy.go
// sizes, slicelease.go leases), charged before a unit is used, so that
// every reader of the counter counts them. The simulator of the promise
// (sim_test.go, make sim) runs them with RLQS buckets and the limiter.
package hotkeys

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Slices takes hot keys off Redis: ShouldRateLimit decides through it
// (it wraps the *limiter.Split), and a key whose hits at this instance pass
// Threshold per second (or, warm, WarmThreshold on average) is decided
// here from a slice of its limit until the slice is used up, goes unused,
// or reaches the end its algorithm's bound sets: docs/reliability.md, "Hot
// keys", has the bounds, the sizes, the ends and what is never leased.
type Slices struct {
	ledger    SliceLedger
	threshold float64
	warm      float64 // warm keys' threshold (their rate's); <= 0: off
	period    time.Duration
	hitsToPay float64 // see SliceOptions.HitsToPay
	perShard  int
	now       func() time.Time
	observe   SliceObserver

	seed   maphash.Seed
	shards [sliceShards]sliceShard

	ctx    context.Context // background work: leases and give backs
	cancel context.CancelFunc
	// returns wait for the next tick, leases for leaseGather, to go together.
	returnsMu sync.Mutex
	returns   []limiter.Return
	leasesMu  sync.Mutex
	leases    []pendingLease
	work      sync.WaitGroup
	// later (time.AfterFunc) and spawn (a goroutine counted in work) start
	// the background work; await waits for a lease's answer or ctx's end.
	// The simulator (sim_test.go), owning time and event order, sets its own.
	later  func(time.Duration, func())
	spawn  func(func())
	await  func(ctx context.Context, landed chan struct{})
	ticker sync.WaitGroup
	stop   chan struct{}
	once   sync.Once
	closed atomic.Bool
	// resetting counts the admin Resets on their way (see lease).
	resetting atomic.Int32
}

// SliceLedger is where slices lease from: ShouldRateLimit's *limiter.Split.
type SliceLedger interface {
	Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error)
	GiveBack(ctx context.Context, returns []limiter.Return) (uint64, error)
	Reset(ctx context.Context, h limiter.Hit) (int64, error)
}

// SliceObserver is told what slices do, for metrics. Any field may be nil.
type SliceObserver struct {
	Local     func(hits int)     // hits decided from a slice
	Leased    func(units uint64) // a slice leased
	GivenBack func(units uint64) // units a slice gave back
	Keys      func(n int)        // keys holding a live slice, every second
	Warm      func(units uint64) // a warm key's slice leased (Leased too)
}

// Defaults where SliceOptions leave a field zero (its fields say more).
const (
	DefaultSliceThreshold     = 3           // hits per second
	DefaultSlicePeriod        = time.Second // periodOf shortens the log's
	DefaultSliceKeys          = 16384
	DefaultSliceWarmThreshold = 0.2 // hits per second, averaged (rateTau)
)

// rateTau is the time constant of a key's averaged rate: each tick (a
// second) weighs the rate before by rateDecay and its hits by 1-rateDecay.
const rateTau = 10 * time.Second

var rateDecay = math.Exp(-float64(time.Second) / float64(rateTau))

// warmForget is the share of the warm threshold under which a key's
// averaged rate lets it be forgotten (holding no slice): a key seen once
// is kept about 7 s, to see one at a fifth of a hit a second again.
const warmForget = 0.25

// SliceOptions configure Slices. A nil *SliceOptions means the defaults.
type SliceOptions struct {
	// Threshold is the hits per second of one key here from which it is
	// leased; zero means DefaultSliceThreshold, negative turns slices off.
	Threshold float64
	// WarmThreshold is the averaged rate of one key here (hits a second
	// over about rateTau) from which a key under Threshold is leased
	// warmSpan of its demand (minSlice units at least) in slices ending
	// after the time those units take at its rate; zero means the default,
	// negative turns warm keys off (a key then goes after a second unhit).
	WarmThreshold float64
	// Period is a slice's life; zero means DefaultSlicePeriod.
	Period time.Duration
	// HitsToPay is how many hits a slice must be expected to decide to be
	// leased (pays); zero means sliceHitsToPay. The simulator lowers it to
	// search the lease's invariants where the policy would not lease.
	HitsToPay float64
	// Keys bounds the keys tracked at once; zero means DefaultSliceKeys.
	// Past it, a key new in a second is not tracked that second.
	Keys int
	// Now is the clock; nil means time.Now. A slice's period and GCRA's
	// unit deadlines run on it from when its lease was sent, so that
	// Redis's clock, which timed the charge later, is never ahead of them.
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
	hits, prev uint32     // hits since the last tick, and in the tick before
	units      uint64     // the units of those hits since the last tick
	prevUnits  uint64     // and in the tick before
	seen       float64    // hits per second, averaged over rateTau at the ticks
	rate       float64    // the same but for the hit that made k tracked (see rates)
	unitRate   float64    // and their units
	weight     float64    // the weight of the ticks since k was tracked: 1 - rateDecay^ticks
	after      uint8      // hits since the one that made k tracked, at most 255
	slices     []*slice   // live, in the order leased
	recorded   []recorded // the log's ended slices whose members may still be ahead of Redis's now
	leasing    bool       // a lease is on its way
	resets     uint32     // admin Resets of the counter: a lease sent before one is not installed
	retryAt    time.Time  // no lease before (after one refused or failed)
	remaining  uint64     // what the counter had left at the last lease answer
	// Units of ended slices given back, which the newest slice's lease
	// answer counted as charged: queued (the store still counts them),
	// landed since that answer, and landed while a lease was on its way.
	unlanded, landed, landedLeasing uint64
	// The least remaining, and the latest GCRA bucket time, the store
	// answered while a lease was on its way (see rebase).
	seenRemaining uint64
	seenTAT       time.Time
	// inFlight is closed once the lease sent for k, if any, has its answer
	// in: an answer of the store meanwhile waits for it (see withHeld).
	inFlight chan struct{}
	// storeNewest: the ledger charged k since the slices last spent, so
	// the newest units, which a refund cancels, are the store's to take back.
	storeNewest bool
	// unseen: what the store holds of k is not known here (a call of it
	// went for a caller that left, or a give-back was answered while a
	// lease was on its way): the next hit asks the store, and the slices
	// take its answer as theirs (rebase); if that hit fails, they stop
	// asking (leftUnseen).
	unseen   bool
	known    bool        // remaining is known
	answered time.Time   // when remaining was answered
	rule     limiter.Hit // the hit the slices are of (Cost unset)
}

// NewSlices returns Slices leasing from ledger. Close stops them.
func NewSlices(ledger SliceLedger, opts *SliceOptions) *Slices {
	return newSlices(ledger, opts, true)
}

// newSlices is NewSlices; ticking false leaves the ticks (turn) to tests.
func newSlices(ledger SliceLedger, opts *SliceOptions, ticking bool) *Slices {
	if opts == nil {
		opts = &SliceOptions{}
	}
	s := &Slices{
		ledger: ledger, threshold: cmp.Or(opts.Threshold, DefaultSliceThreshold),
		warm: cmp.Or(opts.WarmThreshold, DefaultSliceWarmThreshold), period: opts.Period, now: opts.Now,
		observe: opts.Observe, seed: maphash.MakeSeed(), stop: make(chan struct{}),
	}
	if s.threshold < 0 || s.warm >= s.threshold {
		s.warm = -1 // off: no key is warm short of hot
	}
	s.hitsToPay = cmp.Or(opts.HitsToPay, sliceHitsToPay)
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
	s.await = func(ctx context.Context, landed chan struct{}) {
		select {
		case <-landed:
		case <-ctx.Done():
		}
	}
	if s.threshold > 0 && ticking {
		s.ticker.Go(s.tick)
	}
	return s
}

// Decide decides hits as the ledger does: from this instance's slices when
// every hit has one with units left, else on the ledger (see withHeld),
// then leases slices for the hot keys among them in the background.
func (s *Slices) Decide(ctx context.Context, req decision.Request) ([]limiter.Verdict, error) {
	hits := req.Hits
	if s.threshold < 0 || s.closed.Load() || len(hits) == 0 {
		return s.ledger.Decide(ctx, hits)
	}
	if len(hits) == 1 && hits[0].Refund && !req.Route(0).NoSlices && !hits[0].Shadow && !hits[0].Quota {
		if v, ok := s.refundLocally(&hits[0]); ok {
			return []limiter.Verdict{v}, nil
		}
	}
	if !s.leasable(req) {
		sent := s.now()
		verdicts, err := s.ledger.Decide(ctx, hits)
		s.withHeld(ctx, req, verdicts, sent) // a failed part's verdicts among them
		s.leftUnseen(ctx, req, false, err)
		return verdicts, err
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
		s.withHeld(ctx, req, verdicts, now)
		s.leftUnseen(ctx, req, true, err)
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

// refundLocally gives a refund's units back to this instance's live
// slices of its key when they spent as many (a refund cancels the newest
// units admitted, on a hot key the slices'), to spend again, and answers
// as a slice does. Nothing goes to the store, whose refund never takes a
// slice's units (a log's members, GCRA's time a live slice holds). A GCRA
// slice takes back only units spent ahead of their slots (slice.spent).
func (s *Slices) refundLocally(h *limiter.Hit) (limiter.Verdict, bool) {
	sh := s.shard(h.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[h.Key]
	now := s.now()
	if k == nil || !k.matches(h) || k.leasing || k.inFlight != nil || k.storeNewest {
		return limiter.Verdict{}, false
	}
	var spent uint64
	for _, sl := range k.slices {
		spent += sl.spent(now)
	}
	if spent < h.Cost {
		return limiter.Verdict{}, false
	}
	need := h.Cost
	for i := len(k.slices) - 1; i >= 0 && need > 0; i-- { // the newest units first
		sl := k.slices[i]
		back := min(sl.spent(now), need)
		sl.used -= back
		need -= back
	}
	v := limiter.Verdict{Admitted: true}
	k.answer(h, &v, now)
	if newest := k.slices[len(k.slices)-1]; newest.interval == 0 { // GCRA's answer says its reset
		v.ResetAfter = max(0, newest.resetAfter-now.Sub(newest.sent))
	}
	if s.observe.Local != nil {
		s.observe.Local(1)
	}
	return v, true
}

// withHeld adds to the ledger's answers the units this instance's slices
// of their keys still hold, its to give, so that one instance answers as
// without slices: not to shadow and quota-mode answers (Redis's) or a
// failure verdict (the failure mode's), but to the store's answers of a
// request one part of which failed. A lease of their keys on its way may
// have been charged before or after them: its answer is awaited (rebase).
// A request that gives back on a key (a refund, a settlement) as well as
// charging it rebases all its hits of the key as give-backs (their answer
// may be more than the slices' last), the last of them, whose answer is
// the state the request left, last.
// sent is when the request went to the ledger.
func (s *Slices) withHeld(ctx context.Context, req decision.Request, verdicts []limiter.Verdict, sent time.Time) {
	n := min(len(req.Hits), len(verdicts))
	var gaveOn []string // keys given back on, rare
	for i := range n {
		if h := &req.Hits[i]; h.Refund || h.Settle != "" {
			gaveOn = append(gaveOn, h.Key)
		}
	}
	for i := range n {
		s.withHeldHit(ctx, req, i, &verdicts[i], slices.Contains(gaveOn, req.Hits[i].Key), sent)
	}
}

// leftUnseen marks req's keys with slices unseen once its caller left:
// its call may have landed after, and through one instance the answers
// must still be what the store would say. A hit the slices could have
// decided (leasable) that asked the store for that reason and failed
// (its caller left too, or the store is down) asks no more: the slices
// keep deciding, their units charged already.
func (s *Slices) leftUnseen(ctx context.Context, req decision.Request, leasable bool, err error) {
	left := ctx.Err() != nil
	if err == nil && !left {
		return
	}
	for i := range req.Hits {
		sh := s.shard(req.Hits[i].Key)
		sh.mu.Lock()
		if k := sh.keys[req.Hits[i].Key]; k != nil && len(k.slices) > 0 {
			if leasable && k.unseen {
				k.unseen = false
			} else if left {
				k.unseen = true
			}
		}
		sh.mu.Unlock()
	}
}

// withHeldHit is withHeld's for hit i of req, its verdict v; gave says the
// request gave back on its key.
func (s *Slices) withHeldHit(ctx context.Context, req decision.Request, i int, v *limiter.Verdict, gave bool, sent time.Time) {
	h := &req.Hits[i]
	if req.Route(i).NoSlices || h.Shadow || h.Quota || v.FailureVerdict || v.CostExceedsLimit {
		return
	}
	sh := s.shard(h.Key)
	sh.mu.Lock()
	k := sh.keys[h.Key]
	// awaited: a lease was on its way, so this answer may be of a state
	// before or after it.
	awaited := k != nil && k.inFlight != nil
	if awaited {
		landed := k.inFlight
		sh.mu.Unlock()
		s.await(ctx, landed)
		sh.mu.Lock()
		k = sh.keys[h.Key]
	}
	if k != nil && v.Charged && !h.Refund && h.Cost > 0 {
		k.storeNewest = true
	}
	if now := s.now(); k != nil && (k.leasing || k.matches(h)) {
		// An answer that came while a lease was on its way ran before or
		// after it at the store: whether a give-back's is the later state
		// is not known, so the next hit asks again. (A lease still queued
		// comes after it: rebase lets it take what the answer gave.)
		k.rebase(*v, (gave || k.unseen) && !awaited, sent, now)
		k.unseen = awaited && (gave || k.unseen)
		if k.matches(h) && (v.Admitted || k.slices[0].interval == 0) {
			k.answer(h, v, now)
		}
	} else if k != nil && k.unlanded > 0 && k.ruleOf(h) && !h.Algorithm.Bucket() {
		// Its slices ended, their unused units on their way back: the
		// store still counts them, and they are this instance's.
		v.Remaining = min(v.Remaining+k.unlanded, uint64(h.Capacity()))
	}
	sh.mu.Unlock()
}

// leasable reports whether every hit may be decided from a slice, and no
// two share a key (the ledger merges those).
func (s *Slices) leasable(req decision.Request) bool {
	hits := req.Hits
	for i := range hits {
		h := &hits[i]
		if req.Route(i).NoSlices || h.Shadow || h.Quota || h.Record || h.Refund || h.Lease || h.Settle != "" || h.Cost == 0 ||
			h.Algorithm.ReferenceKeys() || h.Cost > uint64(h.Capacity()) {
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
// warm here (read under the same locks). Shards are locked in order, so
// that a request of several keys takes its units all at once.
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
		if !k.matches(h) || k.unseen || k.available(now) < h.Cost {
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

// isHot reports whether k's hits here in the last second, or the second
// before, reach the threshold. The caller holds k's shard's lock.
func (s *Slices) isHot(k *hotKey) bool {
	return float64(max(k.hits, k.prev)) >= s.threshold
}

// isWarm reports whether k's averaged rate reaches the warm threshold and
// h's algorithm takes warm slices: the window counters'. A key that slow
// would mostly miss GCRA's emission slots (its units then dropped), and
// the log's warm slices saved no Redis CPU per decision (docs/bench.md).
// The caller holds k's shard's lock.
func (s *Slices) isWarm(k *hotKey, h *limiter.Hit) bool {
	if s.warm <= 0 || !spansWindow(h.Algorithm) {
		return false
	}
	r, _ := k.rates()
	return r >= s.warm
}

// rates are k's hits and units per second at this instance, averaged over
// about rateTau: its hits at the ticks since it was tracked but the first
// (which made it tracked: no sign of its rate), weighed as the ticks were,
// over the ticks' weight (a key tracked a few seconds ago is not taken as
// idle before). Zero until two hits came after the first: a cold key's
// chance second hit is not a rate. The caller holds k's shard's lock.
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
func (k *hotKey) matches(h *limiter.Hit) bool { return len(k.slices) > 0 && k.ruleOf(h) }

// ruleOf reports whether h is of the rule k's slices were leased for.
func (k *hotKey) ruleOf(h *limiter.Hit) bool {
	r := &k.rule
	return r.Algorithm == h.Algorithm && r.Limit == h.Limit && r.Window == h.Window && r.Calendar == h.Calendar && r.Burst == h.Burst
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
// timeout). Decide then goes to the ledger, which the caller closes after.
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
