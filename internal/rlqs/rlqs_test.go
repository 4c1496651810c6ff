package rlqs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

var epoch = time.Unix(1_700_006_400, 0) // a multiple of 60 s

// fleet is a frozen clock shared by Redis and the allocator, and the
// limiter both lease from.
type fleet struct {
	m     *miniredis.Miniredis
	now   time.Time
	lim   *limiter.Limiter
	alloc *Allocator
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	m, _ := luastore.RunT(t)
	f := &fleet{m: m, now: epoch}
	f.m.SetTime(f.now)
	// Keys' lives run with the clock, as in Redis: the reference's keys
	// name a charge by their expiry.
	f.m.ClockTTL(true)
	// One dial attempt (go-redis's default is five, 100 ms apart): the tests
	// that stop the store wait for its failure, not for retries.
	client := redis.NewClient(&redis.Options{Addr: f.m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	f.lim = limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(f.lim.Close)
	f.alloc = New(f.lim, &Options{Now: func() time.Time { return f.now }})
	return f
}

func (f *fleet) advance(d time.Duration) {
	f.now = f.now.Add(d)
	f.m.SetTime(f.now)
}

// limitOf is a bucket's limit of requests per window on algorithm a.
func limitOf(a config.Algorithm, requests uint32, window time.Duration) Limit {
	kb := limiter.KeyBuilder{Now: epoch}
	kb.Reset("rlqs")
	kb.Add("user", "alice")
	key := kb.Key(a, window)
	return Limit{
		Hits:     []limiter.Hit{{Key: key, Algorithm: a, Limit: requests, Window: window}},
		ShareKey: key + ":rlqs",
	}
}

// envoy is one Envoy's bucket as Envoy's token bucket runs it: refilled
// continuously, capped, starting full when new.
type envoy struct {
	lease   Bucket
	held    Assignment
	tokens  float64
	seen    uint64 // requests since the last report
	created int    // token buckets started
}

// apply takes an assignment as Envoy does: an equal token bucket is kept.
func (e *envoy) apply(a Assignment) {
	if a.Kind == TokenBucket && (e.held.Kind != TokenBucket || e.held.MaxTokens != a.MaxTokens ||
		e.held.TokensPerFill != a.TokensPerFill || e.held.FillInterval != a.FillInterval) {
		e.tokens = float64(a.MaxTokens)
		e.created++
	}
	e.held = a
}

// serve lets n requests arrive evenly over d, returning those admitted.
func (e *envoy) serve(n int, d time.Duration) int {
	admitted := 0
	step := d / time.Duration(max(n, 1))
	for range n {
		if e.held.Kind == TokenBucket {
			rate := float64(e.held.TokensPerFill) / e.held.FillInterval.Seconds()
			e.tokens = math.Min(float64(e.held.MaxTokens), e.tokens+rate*step.Seconds())
		}
		e.seen++
		switch {
		case e.held.Kind == AllowAll:
			admitted++
		case e.held.Kind == TokenBucket && e.tokens >= 1:
			e.tokens--
			admitted++
		}
	}
	if n == 0 && e.held.Kind == TokenBucket {
		rate := float64(e.held.TokensPerFill) / e.held.FillInterval.Seconds()
		e.tokens = math.Min(float64(e.held.MaxTokens), e.tokens+rate*d.Seconds())
	}
	return admitted
}

// decide decides h alone on the fleet's counter.
func (f *fleet) decide(t *testing.T, h limiter.Hit) limiter.Verdict {
	t.Helper()
	v, err := f.lim.Decide(context.Background(), []limiter.Hit{h})
	if err != nil {
		t.Fatal(err)
	}
	return v[0]
}

func (f *fleet) report(t *testing.T, e *envoy, lim Limit) Assignment {
	t.Helper()
	a, err := f.alloc.Report(context.Background(), &e.lease, lim, e.seen)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	e.seen = 0
	e.apply(a) // sent, and arrived
	if err := f.alloc.Confirm(context.Background(), &e.lease, lim); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	return a
}

// TestFleetHoldsTheLimit runs Envoys at twice a limit of 600 a minute, with
// equal and skewed demand, reporting every 5 s, on each algorithm that can
// be leased: the fleet admits at most the bound in every minute, at least
// 90 % of the limit once the first two reports are in, and the shares never
// add up to more than the limit.
func TestFleetHoldsTheLimit(t *testing.T) {
	const limit = 600
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.SlidingWindowLog, config.FixedWindow, config.GCRA} {
		for _, demand := range [][]int{{34, 33, 33}, {60, 30, 10}, {10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, {40, 20, 10, 10, 5, 5, 5, 5, 0, 0}} {
			t.Run(fmt.Sprintf("%v/%v", a, demand), func(t *testing.T) {
				f := newFleet(t)
				lim := limitOf(a, limit, time.Minute)
				envoys := make([]*envoy, len(demand))
				for i := range envoys {
					envoys[i] = &envoy{lease: Bucket{Member: fmt.Sprint("envoy-", i)}}
					envoys[i].seen = 1 // the request that made the bucket
					f.report(t, envoys[i], lim)
				}
				// Per 5 s report interval: admitted requests of the fleet.
				var perInterval []int
				for range 36 { // three minutes
					admitted := 0
					for i, e := range envoys {
						admitted += e.serve(demand[i], 5*time.Second) // per 5 s: 100 in all, twice the limit
					}
					f.advance(5 * time.Second)
					for _, e := range envoys {
						f.report(t, e, lim)
					}
					var sum uint64
					for _, e := range envoys {
						sum += e.lease.tokens()
					}
					if sum > limit {
						t.Fatalf("the shares add up to %d tokens a minute, over the limit of %d", sum, limit)
					}
					perInterval = append(perInterval, admitted)
				}
				// The fleet's leases are on the counter: on a sliding window
				// a caller of the counter (ShouldRateLimit) finds it full. A
				// fixed window's next window, and GCRA's burst, are open to
				// whoever comes first; the fleet's next lease then finds
				// what others took (TestShouldRateLimitTakesTheCounter).
				check := lim.Hits[0]
				check.Cost = 1
				v, err := f.lim.Decide(context.Background(), []limiter.Hit{check})
				if sliding := a == config.SlidingWindowLog || a == config.SlidingWindowCounter; err != nil || sliding && v[0].Admitted {
					t.Errorf("a hit on the counter the fleet uses: %+v %v, want denied", v, err)
				}
				bound := limit
				for _, e := range envoys {
					bound += int(e.held.MaxTokens) * e.created
				}
				for start := 0; start+12 <= len(perInterval); start++ {
					minute := 0
					for _, n := range perInterval[start : start+12] {
						minute += n
					}
					if minute > bound {
						t.Errorf("minute from %v: admitted %d, over the bound %d", time.Duration(start)*5*time.Second, minute, bound)
					}
					if start >= 2 && minute < limit*9/10 {
						t.Errorf("minute from %v: admitted %d, under 90%% of %d", time.Duration(start)*5*time.Second, minute, limit)
					}
				}
			})
		}
	}
}

// TestSteadyDemandKeepsTheBucket: a bucket changed in Envoy starts full
// again, so the assignment stays the same while demand does.
func TestSteadyDemandKeepsTheBucket(t *testing.T) {
	f := newFleet(t)
	lim := limitOf(config.SlidingWindowCounter, 600, time.Minute)
	e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
	f.report(t, e, lim)
	for range 24 {
		e.serve(30, 5*time.Second) // 360 a minute, within the limit
		f.advance(5 * time.Second)
		f.report(t, e, lim)
	}
	if e.created > 2 {
		t.Errorf("%d token buckets for a steady demand: want at most 2 (the first, then the measured share)", e.created)
	}
	if e.held.Kind != TokenBucket || e.held.TTL != DefaultLease || e.held.FillInterval != time.Minute {
		t.Errorf("held %+v, want a token bucket refilled per minute living %v", e.held, DefaultLease)
	}
}

// takeTheRest charges lim's counter, as ShouldRateLimit's callers would,
// with whatever it has left.
func (f *fleet) takeTheRest(t *testing.T, lim Limit) {
	t.Helper()
	check := lim.Hits[0]
	check.Cost = 0
	v, err := f.lim.Decide(context.Background(), []limiter.Hit{check})
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Remaining == 0 {
		return
	}
	take := lim.Hits[0]
	take.Cost = v[0].Remaining
	if v, err := f.lim.Decide(context.Background(), []limiter.Hit{take}); err != nil || !v[0].Admitted {
		t.Fatalf("taking the rest: %+v %v", v, err)
	}
}

// TestShouldRateLimitTakesTheCounter: what the counter admitted outside
// RLQS turns the next assignment to DENY_ALL, and the fleet's leases show
// to the counter's other callers.
func TestShouldRateLimitTakesTheCounter(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.SlidingWindowLog, config.FixedWindow, config.GCRA} {
		t.Run(a.String(), func(t *testing.T) { shouldRateLimitTakes(t, a) })
	}
}

func shouldRateLimitTakes(t *testing.T, a config.Algorithm) {
	f := newFleet(t)
	lim := limitOf(a, 600, time.Minute)
	e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
	if a := f.report(t, e, lim); a.Kind != TokenBucket {
		t.Fatalf("first assignment %+v, want a token bucket", a)
	}
	check := lim.Hits[0]
	check.Cost = 0
	v, err := f.lim.Decide(context.Background(), []limiter.Hit{check})
	if err != nil || v[0].Remaining >= 600 {
		t.Fatalf("after a lease the counter has %d of 600 left (%v): the lease is not on it", v[0].Remaining, err)
	}
	// ShouldRateLimit's callers take what the counter has left, as it
	// frees up. The lease in force stays; within two reports the Envoy is
	// denied, or, on GCRA, which frees units continuously, cut to at most
	// what the first taking left it.
	firstTaken := v[0].Remaining
	for range 2 {
		f.takeTheRest(t, lim)
		f.advance(5 * time.Second)
		e.seen = 100
		f.report(t, e, lim)
	}
	switch {
	case e.held.Kind == DenyAll:
	case a == config.GCRA && e.held.Kind == TokenBucket && e.held.TokensPerFill <= 600-firstTaken:
	default:
		t.Errorf("with the counter taken, the assignment is %+v, want DENY_ALL", e.held)
	}
}

// TestNewAndGoneEnvoys: a new Envoy gets a share at its first report after
// the others reported once; an Envoy that stops reporting loses its share
// when its assignment expires.
func TestNewAndGoneEnvoys(t *testing.T) {
	f := newFleet(t)
	lim := limitOf(config.SlidingWindowCounter, 600, time.Minute)
	first := &envoy{lease: Bucket{Member: "first"}, seen: 1}
	f.report(t, first, lim)
	second := &envoy{lease: Bucket{Member: "second"}, seen: 1}
	f.report(t, second, lim) // the first holds all: nothing left yet
	for range 3 {
		first.serve(100, 5*time.Second)
		second.serve(100, 5*time.Second)
		f.advance(5 * time.Second)
		f.report(t, first, lim)
		f.report(t, second, lim)
	}
	if got := second.lease.tokens(); got < 250 {
		t.Fatalf("the second Envoy holds %d of 600 after three reports, want about half", got)
	}
	// The first stops reporting: after its lease, the second gets it all.
	for range 4 {
		second.serve(100, 5*time.Second)
		f.advance(5 * time.Second)
		f.report(t, second, lim)
	}
	if got := second.lease.tokens(); got < 550 {
		t.Errorf("alone after the first's lease ended, the second holds %d of 600", got)
	}
}

// TestStoreDown: no assignment when the store cannot lease.
func TestStoreDown(t *testing.T) {
	f := newFleet(t)
	lim := limitOf(config.SlidingWindowCounter, 600, time.Minute)
	f.m.Close()
	e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
	if _, err := f.alloc.Report(context.Background(), &e.lease, lim, 1); err == nil {
		t.Error("a report with the store down gave an assignment")
	}
}

// TestShiftingDemand: when demand moves from one Envoy to another, the
// shares follow within a few reports, and the fleet keeps admitting the
// limit: every 5 s after the first three reports that follow a shift
// admits at least 90 % of the limit's 50.
func TestShiftingDemand(t *testing.T) {
	const limit = 600
	f := newFleet(t)
	lim := limitOf(config.SlidingWindowLog, limit, time.Minute)
	envoys := make([]*envoy, 3)
	for i := range envoys {
		envoys[i] = &envoy{lease: Bucket{Member: fmt.Sprint("envoy-", i)}, seen: 1}
		f.report(t, envoys[i], lim)
	}
	phases := [][]int{{60, 30, 10}, {10, 30, 60}, {0, 0, 100}, {50, 50, 0}} // per 5 s: twice the limit
	var least int
	for p, demand := range phases {
		least = limit
		for k := range 12 { // a minute each
			admitted := 0
			for i, e := range envoys {
				admitted += e.serve(demand[i], 5*time.Second)
			}
			f.advance(5 * time.Second)
			for _, e := range envoys {
				f.report(t, e, lim)
			}
			if k >= 3 {
				least = min(least, admitted)
				if admitted < limit/12*9/10 {
					t.Errorf("phase %d (%v), 5 s #%d: admitted %d, under 90%% of %d", p, demand, k, admitted, limit/12)
				}
			}
		}
		t.Logf("demand %v per 5 s: least admitted in 5 s after three reports %d of %d", demand, least, limit/12)
	}
}

// TestLateEnvoyGetsItsShare: an Envoy that joins five that hold the limit
// between them gets its fair share at its next report, once they have
// reported and been sent their smaller shares, however close the old shares
// are to the new ones.
func TestLateEnvoyGetsItsShare(t *testing.T) {
	const limit = 600
	f := newFleet(t)
	lim := limitOf(config.SlidingWindowLog, limit, time.Minute)
	var envoys []*envoy
	join := func() {
		e := &envoy{lease: Bucket{Member: fmt.Sprint("envoy-", len(envoys))}, seen: 1}
		envoys = append(envoys, e)
		f.report(t, e, lim)
	}
	round := func() {
		for _, e := range envoys {
			e.serve(50, 5*time.Second) // 600 a minute each: every one wants more than its part
		}
		f.advance(5 * time.Second)
		for _, e := range envoys {
			f.report(t, e, lim)
		}
	}
	for range 5 {
		join()
	}
	for range 3 {
		round()
	}
	join()
	if got := envoys[len(envoys)-1].lease.tokens(); got != 0 {
		t.Fatalf("the sixth Envoy's first report got %d of a limit the five hold", got)
	}
	round()
	late := envoys[len(envoys)-1].lease.tokens()
	if late < limit/6*9/10 {
		t.Errorf("the sixth Envoy holds %d tokens a minute at its next report, want about %d", late, limit/6)
	}
	var sum uint64
	for _, e := range envoys {
		sum += e.lease.tokens()
	}
	if sum > limit {
		t.Errorf("the six hold %d, over the limit %d", sum, limit)
	}
}

// TestFleetHitKeepsTheCalendar: the fleet's own count of a calendar
// window's leases runs in the same calendar windows as the counter (in
// 30-day epoch windows it would roll over mid-month, and the fleet's
// units would then look like other callers').
func TestFleetHitKeepsTheCalendar(t *testing.T) {
	month := config.CalendarOf(config.FixedWindow, config.Month, 1, time.UTC)
	h := limiter.Hit{Key: "k", Algorithm: config.FixedWindow, Limit: 100, Window: 30 * 24 * time.Hour, Calendar: month}
	if f := fleetHit(h); f.Calendar != month || f.Window != h.Window || f.Algorithm != h.Algorithm {
		t.Errorf("fleetHit(%+v) = %+v, want its calendar, window and algorithm", h, f)
	}
}

// TestAloneDecidedInTheStore: a fleet measured alone at its last lease,
// whose counter ShouldRateLimit's callers have since taken whole, has its
// next lease decided as any hit (denied), not recorded past the limit: the
// store reads the counter and the fleet's own count in the lease's call.
func TestAloneDecidedInTheStore(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.SlidingWindowLog, config.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			f := newFleet(t)
			lim := limitOf(a, 600, time.Minute)
			e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
			if a := f.report(t, e, lim); a.Kind != TokenBucket || e.lease.others != 0 {
				t.Fatalf("first assignment %+v, others %d: want a token bucket, alone", a, e.lease.others)
			}
			f.takeTheRest(t, lim)
			f.advance(5 * time.Second)
			e.seen = 100
			f.report(t, e, lim)
			// 1000 more fit under 1600 only while the counter holds at most
			// its limit: a lease recorded past it would hold more.
			past, err := f.lim.Decide(context.Background(), []limiter.Hit{{Key: lim.Hits[0].Key, Algorithm: a,
				Limit: 600 + 1000, Window: time.Minute, Cost: 1000}})
			if err != nil {
				t.Fatal(err)
			}
			if !past[0].Admitted {
				t.Errorf("the counter holds more than its limit after the lease: recorded beside what others took")
			}
			if e.held.Kind == TokenBucket && e.lease.others <= aloneSlack {
				t.Errorf("the fleet still counts as alone (others %d) with the counter taken", e.lease.others)
			}
		})
	}
}

// TestRefundLeavesTheFleetsLease: a client's refund of a counter an Envoy
// leases from takes the client's own units, never the lease's: those stay
// counted while the Envoy may spend them. The log's refund took the newest
// members, the lease's, and the client's older ones then left the window
// first; GCRA's took the lease's time when the client's had refilled
// (issue 50's kind 2: callers and the fleet past the bucket).
func TestRefundLeavesTheFleetsLease(t *testing.T) {
	for _, tc := range []struct {
		alg config.Algorithm
		// callers is what the bucket still holds of the callers' 10 at the
		// lease, wait on; then, how long after the refund the count is read.
		wait    time.Duration
		callers uint64
		then    time.Duration
		// refund is the units the callers refund, their 10 if 0.
		refund uint64
	}{
		// The lease's members are recorded at its end, 12 s on: the
		// callers' have left the window 51 s on, the lease's not.
		{config.SlidingWindowLog, 10 * time.Second, 10, 51 * time.Second, 0},
		// One a second: the callers' time has refilled by the lease.
		{config.GCRA, 10 * time.Second, 0, 0, 0},
		// Their 9 left under the lease go back, the lease's units stay.
		{config.GCRA, time.Second, 9, 0, 0},
		// A counter's refund takes the callers' 10 and none of the
		// lease's units, however many it names (refund).
		{config.FixedWindow, 10 * time.Second, 10, 0, 60},
		{config.SlidingWindowCounter, 10 * time.Second, 10, 0, 60},
	} {
		t.Run(fmt.Sprintf("%v/after %v", tc.alg, tc.wait), func(t *testing.T) {
			f := newFleet(t)
			lim := limitOf(tc.alg, 60, time.Minute)
			hit := lim.Hits[0]
			charge := hit
			charge.Cost = 10
			if v := f.decide(t, charge); !v.Admitted {
				t.Fatalf("the callers' 10: %+v", v)
			}
			f.advance(tc.wait)
			e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
			if a := f.report(t, e, lim); a.Kind != TokenBucket {
				t.Fatalf("assignment %+v, want a token bucket", a)
			}
			leased := 60 - f.decide(t, hit).Remaining - tc.callers
			if leased == 0 {
				t.Fatal("the lease charged nothing")
			}
			refund := charge
			refund.Refund = true
			if tc.refund > 0 {
				refund.Cost = tc.refund
			}
			f.decide(t, refund)
			f.advance(tc.then)
			if got := 60 - f.decide(t, hit).Remaining; got != leased {
				t.Errorf("the counter holds %d, want the lease's %d", got, leased)
			}
		})
	}
}

// TestResetResetsTheFleetsCount: a Reset of a counter an Envoy leases from
// resets the fleet's own count of it alike, so that their difference is
// still what others took: a fleet count that kept its leases hid the
// callers' units after the reset, and the next lease was recorded past the
// limit beside them as the fleet's alone.
func TestResetResetsTheFleetsCount(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.SlidingWindowLog, config.FixedWindow, config.GCRA, config.ReferenceFixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			f := newFleet(t)
			lim := limitOf(a, 60, time.Minute)
			e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
			f.report(t, e, lim)
			f.advance(5 * time.Second)
			e.seen = 30
			f.report(t, e, lim)
			if _, err := f.lim.Reset(context.Background(), lim.Hits[0]); err != nil {
				t.Fatal(err)
			}
			callers := lim.Hits[0]
			callers.Cost = 5
			if v, err := f.lim.Decide(context.Background(), []limiter.Hit{callers}); err != nil || !v[0].Admitted {
				t.Fatalf("the callers' 5: %+v, %v", v, err)
			}
			if err := f.alloc.measureOthers(context.Background(), &e.lease, lim); err != nil {
				t.Fatal(err)
			}
			if e.lease.others != 5 {
				t.Errorf("others %d after the reset, want the callers' 5", e.lease.others)
			}
		})
	}
}

// failingLedger is the fleet's limiter, whose next Decide fails when armed
// (a store timeout on a lease's call).
type failingLedger struct {
	*limiter.Limiter
	armed bool
}

func (l *failingLedger) Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error) {
	if l.armed {
		l.armed = false
		return nil, errors.New("store: i/o timeout")
	}
	return l.Limiter.Decide(ctx, hits)
}

// TestReplacedBucketGivesBackOnceSent: a bucket whose next report would
// replace it (its demand fell) gives back the refills it leased ahead only
// once its successor was sent (Confirm): when the successor's lease fails,
// or its answer is never sent, Envoy keeps the old bucket until its TTL and
// spends those refills, so the store keeps counting them. Given back before
// the lease's call (in a call of their own), callers took them as well:
// 69 where the bound is 65.
func TestReplacedBucketGivesBackOnceSent(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowLog, config.SlidingWindowCounter, config.FixedWindow} {
		for _, failed := range []string{"lease", "send"} {
			t.Run(a.String()+"/"+failed, func(t *testing.T) {
				f := newFleet(t)
				ledger := &failingLedger{Limiter: f.lim}
				f.alloc = New(ledger, &Options{Now: func() time.Time { return f.now }})
				const limit = 60
				lim := limitOf(a, limit, time.Minute)
				e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
				f.report(t, e, lim)
				admitted := e.serve(50, 5*time.Second)
				f.advance(5 * time.Second)
				f.report(t, e, lim)                   // the measured share
				admitted += e.serve(2, 5*time.Second) // demand falls: the next share is smaller
				f.advance(5 * time.Second)
				ledger.armed = failed == "lease"
				_, err := f.alloc.Report(context.Background(), &e.lease, lim, e.seen)
				if (err != nil) != (failed == "lease") {
					t.Fatalf("the report: %v", err)
				}
				// No answer reached Envoy: it holds its last assignment,
				// sent 5 s ago with a TTL of 11 s, for 6 s more.
				e.seen = 0
				admitted += e.serve(1000, 6*time.Second)
				check := lim.Hits[0]
				check.Cost = 0
				v, err := f.lim.Decide(context.Background(), []limiter.Hit{check})
				if err != nil {
					t.Fatal(err)
				}
				callers := int(v[0].Remaining)
				bound := limit + int(e.held.MaxTokens)*e.created
				if admitted+callers > bound {
					t.Errorf("the Envoy admitted %d and callers may take %d in 16 s: %d, over the bound %d",
						admitted, callers, admitted+callers, bound)
				}
			})
		}
	}
}

// TestRenewalChargedAlreadyKeepsTheBucket: a lone Envoy at a small limit
// (2 a minute), whose report's lease of 5 s of refills rounds to none (the
// last lease's rounding up paid them), keeps its token bucket: the renewal
// asks the store nothing. As a check of the counter, full of the fleet's
// own leases, it was denied, and the bucket turned to DENY_ALL at the sixth
// report. The fleet stays within its bound all the while.
func TestRenewalChargedAlreadyKeepsTheBucket(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.SlidingWindowLog, config.FixedWindow, config.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			f := newFleet(t)
			const limit = 2
			lim := limitOf(a, limit, time.Minute)
			e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
			admitted := 0
			for i := range 12 {
				if got := f.report(t, e, lim); got.Kind != TokenBucket {
					t.Fatalf("report %d: %+v, want the token bucket kept", i+1, got)
				}
				admitted += e.serve(10, 5*time.Second)
				f.advance(5 * time.Second)
			}
			if bound := limit + int(e.held.MaxTokens)*e.created + limit*12/60 + 1; admitted > bound {
				t.Errorf("%d admitted in a minute, over the bound %d", admitted, bound)
			}
		})
	}
}

// givingLedger is the fleet's limiter, adding up what GiveBack gave.
type givingLedger struct {
	*limiter.Limiter
	given uint64
}

func (l *givingLedger) GiveBack(ctx context.Context, r []limiter.Return) (uint64, error) {
	n, err := l.Limiter.GiveBack(ctx, r)
	l.given += n
	return n, err
}

// TestReplacedBucketGivesBack: a bucket replaced by a smaller one (its
// demand fell) gives back what it leased ahead once its successor was sent,
// on every algorithm an RLQS bucket leases from; on the reference's keys
// too, whose charges carry no token (their key names their window): a
// give-back that went only by the charges' tokens gave them nothing back.
func TestReplacedBucketGivesBack(t *testing.T) {
	for _, a := range []config.Algorithm{config.SlidingWindowCounter, config.SlidingWindowLog, config.FixedWindow, config.GCRA, config.ReferenceFixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			f := newFleet(t)
			ledger := &givingLedger{Limiter: f.lim}
			f.alloc = New(ledger, &Options{Now: func() time.Time { return f.now }})
			lim := limitOf(a, 600, time.Minute)
			e := &envoy{lease: Bucket{Member: "one"}, seen: 1}
			f.report(t, e, lim)
			e.serve(500, 5*time.Second)
			f.advance(5 * time.Second)
			big := f.report(t, e, lim) // the measured share
			e.serve(5, 5*time.Second)  // demand falls: the next share is smaller
			f.advance(5 * time.Second)
			if small := f.report(t, e, lim); small.TokensPerFill >= big.TokensPerFill {
				t.Fatalf("the bucket of %d a minute kept %d: want it replaced by a smaller one", big.TokensPerFill, small.TokensPerFill)
			}
			if ledger.given == 0 {
				t.Errorf("the replaced bucket of %d a minute gave nothing back", big.TokensPerFill)
			}
		})
	}
}
