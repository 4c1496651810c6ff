package hotkeys

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// instances are service instances deciding one counter through Slices of
// their own, on one miniredis, under one frozen clock.
type instances struct {
	m      *miniredis.Miniredis
	now    time.Time
	lim    *limiter.Limiter
	slices []*Slices
	local  atomic.Int64
	leased atomic.Int64
	back   atomic.Int64
	warm   atomic.Int64
	// sizes are every slice's size and warmSizes the warm ones', in the
	// order leased, under sizesMu.
	sizesMu   sync.Mutex
	sizes     []uint64
	warmSizes []uint64
}

func newInstances(t *testing.T, n int, opts SliceOptions) *instances {
	t.Helper()
	m, _ := luastore.RunT(t)
	in := &instances{m: m, now: epoch}
	in.m.SetTime(in.now)
	// One dial attempt (go-redis's default is five, 100 ms apart): the tests
	// that stop the store wait for its failure, not for retries.
	client := redis.NewClient(&redis.Options{Addr: in.m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	in.lim = limiter.New(client, &limiter.Options{Timeout: time.Second, DenyCache: -1})
	t.Cleanup(in.lim.Close)
	opts.Now = func() time.Time { return in.now }
	opts.Observe = SliceObserver{
		Local: func(n int) { in.local.Add(int64(n)) },
		Leased: func(n uint64) {
			in.leased.Add(int64(n))
			in.sizesMu.Lock()
			defer in.sizesMu.Unlock()
			in.sizes = append(in.sizes, n)
		},
		GivenBack: func(n uint64) { in.back.Add(int64(n)) },
		Warm: func(n uint64) {
			in.warm.Add(int64(n))
			in.sizesMu.Lock()
			defer in.sizesMu.Unlock()
			in.warmSizes = append(in.warmSizes, n)
		},
	}
	for range n {
		s := newSlices(limiter.NewSplit(in.lim, nil), &opts, false)
		t.Cleanup(s.Close)
		in.slices = append(in.slices, s)
	}
	return in
}

func (in *instances) advance(d time.Duration) {
	in.now = in.now.Add(d)
	in.m.SetTime(in.now)
}

// settle waits for every lease on its way, and gives back what waits for
// a tick.
func (in *instances) settle() {
	for _, s := range in.slices {
		s.work.Wait()
		s.flush()
	}
}

// TestSlicesHoldTheLimit offers a hot key twice its limit, evenly, through
// three instances, and checks every window of the limit's length (for the
// fixed window, every window of its own) against the algorithm's bound, and
// that after the first window at least 90 % of the limit is admitted.
func TestSlicesHoldTheLimit(t *testing.T) {
	const limit, window = 200, 20 * time.Second
	for _, tc := range []struct {
		alg   config.Algorithm
		burst uint32
	}{
		{config.SlidingWindowLog, 0},
		{config.FixedWindow, 0},
		{config.SlidingWindowCounter, 0},
		{config.GCRA, 0},
		{config.GCRA, 40},
	} {
		t.Run(fmt.Sprintf("%v/burst%d", tc.alg, tc.burst), func(t *testing.T) {
			in := newInstances(t, 3, SliceOptions{Threshold: 2})
			hit := limiter.Hit{Key: "{hot}:k", Algorithm: tc.alg, Limit: limit, Window: window, Burst: tc.burst, Cost: 1}
			const step = 50 * time.Millisecond // 20 requests/s: twice 200 per 20 s
			var admitted []time.Time
			start := in.now
			for i := range 1600 { // 80 s: four windows
				s := in.slices[i%3]
				if i%20 == 0 {
					for _, s := range in.slices {
						s.turn(in.now)
					}
				}
				v, err := s.Decide(context.Background(), plain(hit))
				if err != nil {
					t.Fatal(err)
				}
				if v[0].Admitted {
					admitted = append(admitted, in.now)
				}
				in.settle()
				in.advance(step)
			}
			end := in.now
			bound := limit
			if tc.alg == config.GCRA {
				bound = limit + int(max(tc.burst, limit)) // the bucket's own bound: burst plus the limit
				if tc.burst != 0 {
					bound = limit + int(tc.burst)
				}
			}
			least := len(admitted)
			for a := start; !a.Add(window).After(end); a = a.Add(step) {
				if tc.alg == config.FixedWindow && a.Sub(epoch)%window != 0 {
					continue // its windows are aligned
				}
				n := countIn(admitted, a, a.Add(window))
				if tc.alg != config.SlidingWindowCounter && n > bound {
					t.Fatalf("%d admitted in the window from %v, limit %d", n, a.Sub(start), bound)
				}
				if a.Sub(start) >= window {
					least = min(least, n)
				}
			}
			if least < limit*9/10 {
				t.Errorf("least admitted in a window after the first: %d, want >= %d", least, limit*9/10)
			}
			if in.local.Load() == 0 {
				t.Errorf("no hit decided from a slice (leased %d units)", in.leased.Load())
			}
			t.Logf("%d admitted of 1600 in %v; least in a window after the first %d; %d decided locally; %d units leased, %d given back",
				len(admitted), end.Sub(start), least, in.local.Load(), in.leased.Load(), in.back.Load())
		})
	}
}

// countIn counts the instants in [from, to).
func countIn(ts []time.Time, from, to time.Time) int {
	i, _ := slices.BinarySearchFunc(ts, from, func(a, b time.Time) int { return a.Compare(b) })
	j, _ := slices.BinarySearchFunc(ts, to, func(a, b time.Time) int { return a.Compare(b) })
	return j - i
}

// TestSlicesCountExactly offers a hot key far below its limit through three
// instances: most hits are decided locally, and once the slices have given
// back what they did not use, the counter holds exactly the hits admitted.
func TestSlicesCountExactly(t *testing.T) {
	for _, alg := range []config.Algorithm{config.SlidingWindowLog, config.FixedWindow, config.SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			in := newInstances(t, 3, SliceOptions{})
			hit := limiter.Hit{Key: "{hot}:k", Algorithm: alg, Limit: 10000, Window: time.Minute, Cost: 1}
			admitted := 0
			const step = 2 * time.Millisecond // 500 requests/s
			for i := range 2500 {
				if i%500 == 0 {
					for _, s := range in.slices {
						s.turn(in.now)
					}
				}
				v, err := in.slices[i%3].Decide(context.Background(), plain(hit))
				if err != nil {
					t.Fatal(err)
				}
				if v[0].Admitted {
					admitted++
				}
				in.settle()
				in.advance(step)
			}
			if admitted != 2500 {
				t.Fatalf("admitted %d of 2500 under a limit of 10000", admitted)
			}
			for _, s := range in.slices {
				s.Close()
			}
			check := hit
			check.Cost = 0
			v, err := in.lim.Decide(context.Background(), []limiter.Hit{check})
			if err != nil {
				t.Fatal(err)
			}
			if used := 10000 - int(v[0].Remaining); used != admitted {
				t.Errorf("the counter holds %d units after the give backs, want the %d admitted (leased %d, given back %d)",
					used, admitted, in.leased.Load(), in.back.Load())
			}
			if local := in.local.Load(); local < 2500*8/10 {
				t.Errorf("%d of 2500 decided locally, want at least 80 %%", local)
			}
			t.Logf("%d decided locally; %d units leased, %d given back", in.local.Load(), in.leased.Load(), in.back.Load())
		})
	}
}

// TestSlicesOutlastAnOutage: when the store stops answering, a hot key
// keeps deciding from its slices until they are used up, then by its
// failure mode.
func TestSlicesOutlastAnOutage(t *testing.T) {
	in := newInstances(t, 1, SliceOptions{})
	s := in.slices[0]
	hit := limiter.Hit{Key: "{hot}:k", Algorithm: config.FixedWindow, Limit: 100000, Window: time.Minute, Cost: 1,
		FailureMode: config.FailureDeny}
	decide := func() limiter.Verdict {
		v, _ := s.Decide(context.Background(), plain(hit))
		in.settle()
		return v[0]
	}
	for range 100 {
		decide()
		in.advance(time.Millisecond)
	}
	s.turn(in.now)
	for range 100 {
		decide()
		in.advance(time.Millisecond)
	}
	in.m.Close()
	held := in.leased.Load() - in.local.Load()
	if held <= 0 {
		t.Fatalf("no slice held when the store stopped (leased %d, used %d)", in.leased.Load(), in.local.Load())
	}
	for i := range held + 1 {
		v := decide()
		if i < held && (!v.Admitted || v.FailureVerdict) {
			t.Fatalf("with the store down, hit %d of the %d units the slices held: %+v", i+1, held, v)
		}
		if i == held && (v.Admitted || !v.FailureVerdict) {
			t.Errorf("the slices used up, with the store down: %+v, want the failure mode's denial", v)
		}
	}
}

// TestSlicesLeaseAgainAfterTheLimit: a hot key that reaches its limit in
// every window (200 offered per 150) is decided from slices again in each
// new window: what the counter has left is read from every store answer,
// not only from leases.
func TestSlicesLeaseAgainAfterTheLimit(t *testing.T) {
	in := newInstances(t, 1, SliceOptions{})
	s := in.slices[0]
	hit := limiter.Hit{Key: "{h}:k", Algorithm: config.FixedWindow, Limit: 150, Window: 10 * time.Second, Cost: 1}
	const step = 50 * time.Millisecond // 20/s
	for w := range 4 {
		local, admitted := in.local.Load(), 0
		for i := range 200 {
			if i%20 == 0 {
				s.turn(in.now)
			}
			v, err := s.Decide(context.Background(), plain(hit))
			if err != nil {
				t.Fatal(err)
			}
			if v[0].Admitted {
				admitted++
			}
			in.settle()
			in.advance(step)
		}
		local = in.local.Load() - local
		t.Logf("window %d: %d admitted, %d decided locally", w, admitted, local)
		if admitted != 150 || local < 100 {
			t.Errorf("window %d: %d admitted (want the limit, 150), %d decided locally (want most)", w, admitted, local)
		}
	}
}

// TestSlicesOnlyWhereAllHot: a hot key that always comes with a cold one in
// its request (nested descriptors) is never decided locally, so it leases
// no slice: the limit is reached exactly as without slices.
func TestSlicesOnlyWhereAllHot(t *testing.T) {
	in := newInstances(t, 3, SliceOptions{})
	hot := limiter.Hit{Key: "{h}:tenant", Algorithm: config.FixedWindow, Limit: 900, Window: 10 * time.Second, Cost: 1}
	admitted := 0
	for i := range 1000 {
		if i%100 == 0 {
			for _, s := range in.slices {
				s.turn(in.now)
			}
		}
		cold := limiter.Hit{Key: fmt.Sprintf("{h}:user%d", i), Algorithm: config.FixedWindow, Limit: 1000, Window: 10 * time.Second, Cost: 1}
		v, err := in.slices[i%3].Decide(context.Background(), plain(hot, cold))
		if err != nil {
			t.Fatal(err)
		}
		if v[0].Admitted {
			admitted++
		} else if admitted < 900 {
			t.Fatalf("denied with %d admitted, limit 900", admitted)
		}
		in.settle()
		in.advance(10 * time.Millisecond)
	}
	if admitted != 900 || in.leased.Load() != 0 {
		t.Errorf("%d admitted (want 900), %d units leased (want none)", admitted, in.leased.Load())
	}
}

// TestSlicesResetDropsThem: the admin API's Reset through Slices drops the
// instance's slices of the counter, so that nothing they held comes off
// the new count: after the reset the window admits the limit, no more.
func TestSlicesResetDropsThem(t *testing.T) {
	for _, alg := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.SlidingWindowLog} {
		t.Run(alg.String(), func(t *testing.T) {
			in := newInstances(t, 1, SliceOptions{})
			s := in.slices[0]
			hit := limiter.Hit{Key: "{h}:k", Algorithm: alg, Limit: 100, Window: time.Minute, Cost: 1}
			for i := range 30 {
				if i == 10 {
					s.turn(in.now)
				}
				if _, err := s.Decide(context.Background(), plain(hit)); err != nil {
					t.Fatal(err)
				}
				in.settle()
				in.advance(10 * time.Millisecond)
			}
			if in.leased.Load() == 0 {
				t.Fatal("no slice leased before the reset")
			}
			if _, err := s.Reset(context.Background(), hit); err != nil {
				t.Fatal(err)
			}
			after := 0
			decide := func() {
				v, _ := in.lim.Decide(context.Background(), []limiter.Hit{hit})
				if v[0].Admitted {
					after++
				}
			}
			for range 200 {
				decide()
			}
			in.advance(2 * time.Second) // past any slice's idle end
			s.turn(in.now)
			in.settle()
			for range 200 {
				decide()
			}
			if after != 100 || in.back.Load() != 0 {
				t.Errorf("after the reset: %d admitted within the minute (want the limit, 100), %d units given back (want none)",
					after, in.back.Load())
			}
		})
	}
}

// TestSlicesGiveBackOnlyWhatStillCounts: a slice of a hot key that ends
// with its window, units unused, gives them back when the count still
// matters (the sliding counter weighs the ended window through the next
// one) and not for a fixed window, whose ended count no one reads: no
// Redis call for it.
func TestSlicesGiveBackOnlyWhatStillCounts(t *testing.T) {
	for _, tc := range []struct {
		alg       config.Algorithm
		givesBack bool
	}{{config.FixedWindow, false}, {config.SlidingWindowCounter, true}} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			in := newInstances(t, 1, SliceOptions{})
			const window = 10 * time.Second
			hit := limiter.Hit{Key: "{e}:k", Algorithm: tc.alg, Limit: 100000, Window: window, Cost: 1}
			// 20 hits a second for 9.5 s of the window, then none.
			for i := range 190 {
				if i%20 == 0 {
					in.slices[0].turn(in.now)
				}
				if _, err := in.slices[0].Decide(context.Background(), plain(hit)); err != nil {
					t.Fatal(err)
				}
				in.settle()
				in.advance(50 * time.Millisecond)
			}
			unused := in.leased.Load() - in.local.Load()
			if unused <= 0 {
				t.Fatalf("%d units leased, %d used: want some unused at the window's end", in.leased.Load(), in.local.Load())
			}
			for range 3 { // past the window's end
				in.advance(time.Second)
				in.slices[0].turn(in.now)
				in.slices[0].flush()
			}
			switch back := in.back.Load(); {
			case tc.givesBack && back != unused:
				t.Errorf("%d of %d unused units given back, want all", back, unused)
			case !tc.givesBack && back != 0:
				t.Errorf("%d of %d unused units given back to an ended fixed window, want none", back, unused)
			}
		})
	}
}

// TestSlicesRefundAfterAPartlyFailedRequest: a request whose hot key's
// hit the store charged while its other part failed (the per-second store
// down) leaves the store's unit the newest of the key: a refund right after
// is the store's, not given back to the slice, which would spend it again
// beside the store's charge.
func TestSlicesRefundAfterAPartlyFailedRequest(t *testing.T) {
	in := newInstances(t, 0, SliceOptions{})
	second, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: second.Addr(), DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	perSecond := limiter.New(client, &limiter.Options{Timeout: time.Second, DenyCache: -1})
	t.Cleanup(perSecond.Close)
	s := newSlices(limiter.NewSplit(in.lim, perSecond), &SliceOptions{
		Now:     func() time.Time { return in.now },
		Observe: SliceObserver{Local: func(n int) { in.local.Add(int64(n)) }},
	}, false)
	t.Cleanup(s.Close)
	in.slices = []*Slices{s}
	hit := limiter.Hit{Key: "{h}:k", Algorithm: config.FixedWindow, Limit: 150, Window: 10 * time.Second, Cost: 1}
	for i := range 40 { // 20 a second: the key leases a slice and spends from it
		if i%20 == 0 {
			s.turn(in.now)
		}
		if _, err := s.Decide(context.Background(), plain(hit)); err != nil {
			t.Fatal(err)
		}
		in.settle()
		in.advance(50 * time.Millisecond)
	}
	if in.local.Load() == 0 {
		t.Fatal("no hit was decided from a slice: the key never leased one")
	}
	second.Close()
	other := limiter.Hit{Key: "{o}:k", Algorithm: config.FixedWindow, Limit: 10, Window: time.Second, Cost: 1}
	v, err := s.Decide(context.Background(), plain(hit, other))
	if err == nil || !v[0].Charged || !v[1].FailureVerdict {
		t.Fatalf("want the hot key charged at the store and the per-second part failed: %+v, %v", v, err)
	}
	local := in.local.Load()
	refund := hit
	refund.Refund = true
	if _, err := s.Decide(context.Background(), plain(refund)); err != nil {
		t.Fatal(err)
	}
	if in.local.Load() != local {
		t.Error("the refund was given back to the slice, though the store's charge was the newest unit of the key")
	}
}

// plain is hits as a request of no global rule, each sliceable.
func plain(hits ...limiter.Hit) decision.Request { return decision.Request{Hits: hits} }
