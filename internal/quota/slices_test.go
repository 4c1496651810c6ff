package quota

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
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
	in := &instances{m: miniredis.RunT(t), now: epoch}
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
	const limit, window = 100, 10 * time.Second
	for _, tc := range []struct {
		alg   config.Algorithm
		burst uint32
	}{
		{config.SlidingWindowLog, 0},
		{config.FixedWindow, 0},
		{config.SlidingWindowCounter, 0},
		{config.GCRA, 0},
		{config.GCRA, 20},
	} {
		t.Run(fmt.Sprintf("%v/burst%d", tc.alg, tc.burst), func(t *testing.T) {
			in := newInstances(t, 3, SliceOptions{Threshold: 2})
			hit := limiter.Hit{Key: "{hot}:k", Algorithm: tc.alg, Limit: limit, Window: window, Burst: tc.burst, Cost: 1}
			const step = 50 * time.Millisecond // 20 requests/s: twice 100 per 10 s
			var admitted []time.Time
			start := in.now
			for i := range 800 { // 40 s: four windows
				s := in.slices[i%3]
				if i%20 == 0 {
					for _, s := range in.slices {
						s.turn(in.now)
					}
				}
				v, err := s.Decide(context.Background(), []limiter.Hit{hit})
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
			t.Logf("%d admitted of 800 in %v; least in a window after the first %d; %d decided locally; %d units leased, %d given back",
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
				v, err := in.slices[i%3].Decide(context.Background(), []limiter.Hit{hit})
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
		v, _ := s.Decide(context.Background(), []limiter.Hit{hit})
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
			v, err := s.Decide(context.Background(), []limiter.Hit{hit})
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
		v, err := in.slices[i%3].Decide(context.Background(), []limiter.Hit{hot, cold})
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
				if _, err := s.Decide(context.Background(), []limiter.Hit{hit}); err != nil {
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

// warmHits sends hit to every instance every 2 s (half a hit a second at
// each, a warm key's rate), n times, ticking every instance each second,
// and returns the instants of the hits admitted and how many were decided
// on the store.
func (in *instances) warmHits(t *testing.T, hit limiter.Hit, n int) (admitted []time.Time, onStore int) {
	t.Helper()
	for range n {
		for _, s := range in.slices {
			local := in.local.Load()
			v, err := s.Decide(context.Background(), []limiter.Hit{hit})
			if err != nil {
				t.Fatal(err)
			}
			if in.local.Load() == local {
				onStore++
			}
			if v[0].Admitted {
				admitted = append(admitted, in.now)
			}
			in.settle()
			in.advance(time.Millisecond)
		}
		for range 2 {
			in.advance(time.Second)
			for _, s := range in.slices {
				s.turn(in.now)
			}
		}
		in.settle()
	}
	return admitted, onStore
}

// TestSlicesWarmKey: a key at half a hit a second at one instance, far
// under the hot threshold, is leased slices once its averaged rate passes
// the warm threshold, and decides its later hits from them; every unit
// leased is used or given back. A slice holds warmSpan of the key's demand
// (5 units at half a hit a second), at least minSlice; the log's, which
// live a twentieth of the window at most, minSlice.
func TestSlicesWarmKey(t *testing.T) {
	for _, tc := range []struct {
		alg         config.Algorithm
		least, most uint64 // a slice's size: its rate is an average, young keys' a little high
	}{
		{config.SlidingWindowLog, minSlice, minSlice},
		{config.FixedWindow, minSlice, 7},
		{config.SlidingWindowCounter, minSlice, 7},
	} {
		alg := tc.alg
		t.Run(alg.String(), func(t *testing.T) {
			in := newInstances(t, 1, SliceOptions{})
			hit := limiter.Hit{Key: "{w}:k", Algorithm: alg, Limit: 100000, Window: time.Hour, Cost: 1}
			admitted, onStore := in.warmHits(t, hit, 120) // 240 s
			t.Logf("%d of 120 hits on the store, %d local; %d units leased (%d warm), %d given back",
				onStore, in.local.Load(), in.leased.Load(), in.warm.Load(), in.back.Load())
			if len(admitted) != 120 {
				t.Fatalf("%d of 120 admitted under a limit of 100000", len(admitted))
			}
			// The rate is known after two hits beyond the first (4 s):
			// the next finds the key warm and leases, the one after that
			// is decided from the slice.
			if onStore > 5 || in.local.Load() < 115 {
				t.Errorf("%d hits on the store, %d local: want the warm key decided locally after its first few hits",
					onStore, in.local.Load())
			}
			if in.warm.Load() != in.leased.Load() {
				t.Errorf("%d units leased, %d of them to a warm key: want only warm slices", in.leased.Load(), in.warm.Load())
			}
			in.sizesMu.Lock()
			sizes := in.warmSizes
			in.sizesMu.Unlock()
			for _, n := range sizes {
				if n < tc.least || n > tc.most {
					t.Errorf("warm slices of %v units: want %d to %d each", sizes, tc.least, tc.most)
					break
				}
			}
			if alg != config.SlidingWindowLog && sizes[len(sizes)-1] != 5 {
				t.Errorf("warm slices of %v units: want the last, at a steady half hit a second, of 5 (%s of demand)", sizes, warmSpan)
			}
			in.slices[0].Close()
			if used := in.local.Load() + in.back.Load(); used != in.leased.Load() {
				t.Errorf("%d units leased, %d used and %d given back", in.leased.Load(), in.local.Load(), in.back.Load())
			}
		})
	}
}

// TestSlicesWarmKeyOff: with the warm threshold off, or for GCRA (whose
// units' emission slots a warm key would miss), a key at half a hit a
// second is never leased.
func TestSlicesWarmKeyOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		alg  config.Algorithm
		warm float64
	}{
		{"off", config.FixedWindow, -1},
		{"above the hot threshold", config.FixedWindow, DefaultSliceThreshold},
		{"gcra", config.GCRA, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInstances(t, 1, SliceOptions{WarmThreshold: tc.warm})
			hit := limiter.Hit{Key: "{w}:k", Algorithm: tc.alg, Limit: 100000, Window: time.Hour, Cost: 1}
			if _, onStore := in.warmHits(t, hit, 30); onStore != 30 || in.leased.Load() != 0 {
				t.Errorf("%d of 30 hits on the store (want all), %d units leased (want none)", onStore, in.leased.Load())
			}
			if n := in.slices[0].tracked(); tc.warm < 0 && n != 0 {
				t.Errorf("%d keys tracked after a second without hits, warm keys off: want none", n)
			}
		})
	}
}

// TestSlicesWarmSliceEndsIdle: a warm key's slice ends, and gives back
// what it did not use, after the time its units take at the key's rate
// unused (4 units at half a hit a second: about 8 s), not after the
// period (1 s).
func TestSlicesWarmSliceEndsIdle(t *testing.T) {
	for _, alg := range []config.Algorithm{config.SlidingWindowLog, config.FixedWindow, config.SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			in := newInstances(t, 1, SliceOptions{})
			hit := limiter.Hit{Key: "{w}:k", Algorithm: alg, Limit: 100000, Window: time.Hour, Cost: 1}
			in.warmHits(t, hit, 22) // 44 s: the rate averaged near 0.5/s
			held := in.leased.Load() - in.local.Load() - in.back.Load()
			if held <= 0 || held >= minSlice {
				t.Fatalf("%d units held after a warm key's hit (leased %d, used %d, given back %d): want a slice partly used",
					held, in.leased.Load(), in.local.Load(), in.back.Load())
			}
			// The last hit was 2 s ago: the idle time is counted from it.
			ended := time.Duration(0)
			for idle := 2 * time.Second; idle <= 30*time.Second; idle += time.Second {
				if in.back.Load() > 0 {
					ended = idle
					break
				}
				in.advance(time.Second)
				in.slices[0].turn(in.now)
				in.settle()
			}
			// 4 units at 0.5/s: about 8 s after its last use; the log's
			// slice ends with its period, 8 s after its lease, which was
			// 2 s before the first of the units it used.
			want := 8 * time.Second
			if alg == config.SlidingWindowLog {
				want -= 2 * time.Second * time.Duration(minSlice-held)
			}
			if ended < want-time.Second || ended > want+3*time.Second {
				t.Errorf("the slice ended %v after its last use, want about %v (4 units at 0.5/s)", ended, want)
			}
			if in.back.Load() != held {
				t.Errorf("%d units given back, want the %d the slice held", in.back.Load(), held)
			}
			t.Logf("slice ended %v after its last use, giving back %d units", ended, held)
		})
	}
}

// tracked is the number of keys s tracks.
func (s *Slices) tracked() int {
	n := 0
	s.each(func(*hotKey) { n++ })
	return n
}

// leaseRecorder is a ledger that checks each lease (a hit of more than
// one unit: the tests' hits cost one) against what the counter had left
// just before it.
type leaseRecorder struct {
	SliceLedger
	t       *testing.T
	lim     *limiter.Limiter
	quarter bool // check each lease against a quarter of what is left
	leases  int
}

func (r *leaseRecorder) Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error) {
	if len(hits) == 1 && hits[0].Cost > 1 {
		check := hits[0]
		check.Cost, check.Ahead = 0, 0
		v, err := r.lim.Decide(ctx, []limiter.Hit{check})
		if err != nil {
			r.t.Error(err)
		} else if r.quarter && hits[0].Cost > v[0].Remaining/4 {
			r.t.Errorf("a lease of %d units with %d left: more than a quarter", hits[0].Cost, v[0].Remaining)
		}
		r.leases++
	}
	return r.SliceLedger.Decide(ctx, hits)
}

// TestSlicesWarmKeyNearItsLimit: a warm key offered 1.5 times its limit
// (half a hit a second at each instance, a limit of 20 a minute per
// instance) never passes the limit: in every window of its length (the
// fixed window's own windows) at most the limit is admitted. At one
// instance, where the last store answer is what the counter has left, no
// slice is of more than a quarter of it; at three, each instance's answer
// misses the others' use since, so that is not checked there (the limit
// is: a lease that does not fit is not made).
func TestSlicesWarmKeyNearItsLimit(t *testing.T) {
	for _, n := range []int{1, 3} {
		for _, alg := range []config.Algorithm{config.SlidingWindowLog, config.FixedWindow, config.SlidingWindowCounter} {
			t.Run(fmt.Sprintf("%d/%v", n, alg), func(t *testing.T) {
				window := time.Minute
				if alg == config.SlidingWindowLog {
					window = 4 * time.Minute // its slices live a twentieth of it: 12 s, 6 hits' time
				}
				limit := 20 * n
				in := newInstances(t, 0, SliceOptions{})
				rec := &leaseRecorder{t: t, lim: in.lim, quarter: n == 1}
				rec.SliceLedger = limiter.NewSplit(in.lim, nil)
				opts := SliceOptions{Now: func() time.Time { return in.now }, Observe: SliceObserver{
					Local:     func(n int) { in.local.Add(int64(n)) },
					Leased:    func(n uint64) { in.leased.Add(int64(n)) },
					GivenBack: func(n uint64) { in.back.Add(int64(n)) },
				}}
				for range n {
					s := newSlices(rec, &opts, false)
					t.Cleanup(s.Close)
					in.slices = append(in.slices, s)
				}
				hit := limiter.Hit{Key: "{w}:k", Algorithm: alg, Limit: uint32(limit), Window: window, Cost: 1}
				admitted, onStore := in.warmHits(t, hit, 300) // 600 s: ten windows
				least := limit
				for a := epoch; !a.Add(window).After(in.now); a = a.Add(time.Second) {
					if alg == config.FixedWindow && a.Sub(epoch)%window != 0 {
						continue
					}
					got := countIn(admitted, a, a.Add(window))
					if alg != config.SlidingWindowCounter && got > limit {
						t.Fatalf("%d admitted in the window from %v, limit %d", got, a.Sub(epoch), limit)
					}
					if a.Sub(epoch) >= window {
						least = min(least, got)
					}
				}
				if rec.leases == 0 || in.local.Load() == 0 {
					t.Errorf("%d leases, %d hits decided locally: want the warm key leased", rec.leases, in.local.Load())
				}
				t.Logf("%d admitted of %d (%d a window at most), least in a window after the first %d; %d on the store, %d local; %d leases, %d units, %d given back",
					len(admitted), 300*n, limit, least, onStore, in.local.Load(), rec.leases, in.leased.Load(), in.back.Load())
			})
		}
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
				if _, err := in.slices[0].Decide(context.Background(), []limiter.Hit{hit}); err != nil {
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

// TestSlicesHotSpan: a hot key's slice of a window counter (fixed or
// sliding) holds warmSpan of its demand, as a warm key's does, and lives
// as long as its units take at the key's rate unused, so a pause of a few
// periods does not end it; the log's and GCRA's hold a period of demand,
// their bounds being a period's. A key at 10 hits a second for 40 s.
func TestSlicesHotSpan(t *testing.T) {
	for _, tc := range []struct {
		alg         config.Algorithm
		warm        float64 // the warm threshold; -1: off
		least, most uint64  // the steady slice's size
	}{
		{config.FixedWindow, 0, 80, 120},
		{config.SlidingWindowCounter, 0, 80, 120},
		{config.SlidingWindowLog, 0, 10, 10},
		{config.GCRA, 0, 0, 0},                    // 10 a second under a bucket leaking 278: no slice
		{config.SlidingWindowCounter, -1, 10, 10}, // warm keys off: a period's demand
	} {
		t.Run(fmt.Sprintf("%v/warm%v", tc.alg, tc.warm), func(t *testing.T) {
			in := newInstances(t, 1, SliceOptions{WarmThreshold: tc.warm})
			hit := limiter.Hit{Key: "{h}:k", Algorithm: tc.alg, Limit: 1000000, Window: time.Hour, Cost: 1}
			s := in.slices[0]
			send := func(seconds int) { in.tenASecond(t, s, hit, seconds) }
			send(40)
			in.sizesMu.Lock()
			sizes := slices.Clone(in.sizes)
			in.sizesMu.Unlock()
			t.Logf("slices of %v units; %d hits local of 400", sizes, in.local.Load())
			if tc.most == 0 {
				if len(sizes) > 0 {
					t.Errorf("slices of %v units: want none", sizes)
				}
				return
			}
			if last := sizes[len(sizes)-1]; last < tc.least || last > tc.most {
				t.Errorf("the steady slice of %d units at 10 hits a second: want %d to %d", last, tc.least, tc.most)
			}
			if tc.least < 80 {
				return
			}
			// A pause of three periods, then the same pace: the slice lives.
			for range 3 {
				in.advance(time.Second)
				s.turn(in.now)
			}
			in.settle()
			leases, local := len(sizes), in.local.Load()
			send(2)
			if in.back.Load() != 0 {
				t.Errorf("%d units given back after a pause of 3 s: want the slice of %s of demand kept", in.back.Load(), warmSpan)
			}
			in.sizesMu.Lock()
			leased := len(in.sizes) - leases
			in.sizesMu.Unlock()
			if in.local.Load()-local < 19 || leased > 1 {
				t.Errorf("after the pause, %d of 20 hits local and %d slices leased: want every hit (but one) from the live slice",
					in.local.Load()-local, leased)
			}
		})
	}
}

// tenASecond sends hit through s ten times a second for seconds, each
// admitted (its limit far above), the clock moving and s ticking as it goes.
func (in *instances) tenASecond(t *testing.T, s *Slices, hit limiter.Hit, seconds int) {
	t.Helper()
	for range seconds {
		for range 10 {
			if v, err := s.Decide(context.Background(), []limiter.Hit{hit}); err != nil || !v[0].Admitted {
				t.Fatalf("a hit under a limit of a million: %v, %v", v, err)
			}
			in.settle()
			in.advance(100 * time.Millisecond)
		}
		s.turn(in.now)
		in.settle()
	}
}

// TestSlicesFixedWindowEnd: a hot fixed window's slice holds no more than
// what its key's rate uses before the window ends, where its units die
// (they are not given back to a window no one reads): with windows of 10 s,
// as long as the span of demand a slice holds, the units leased and never
// used stay under a window's worth of demand in all.
func TestSlicesFixedWindowEnd(t *testing.T) {
	in := newInstances(t, 1, SliceOptions{})
	hit := limiter.Hit{Key: "{h}:k", Algorithm: config.FixedWindow, Limit: 1000000, Window: 10 * time.Second, Cost: 1}
	in.tenASecond(t, in.slices[0], hit, 60)
	in.sizesMu.Lock()
	sizes := slices.Clone(in.sizes)
	in.sizesMu.Unlock()
	unused := in.leased.Load() - in.local.Load()
	t.Logf("slices of %v units; %d hits local of 600; %d units leased, %d never used", sizes, in.local.Load(), in.leased.Load(), unused)
	if in.local.Load() < 400 {
		t.Errorf("%d hits of 600 decided from slices: want most", in.local.Load())
	}
	if unused > 100 {
		t.Errorf("%d units leased and never used over six windows: want under a window's demand (100)", unused)
	}
}

// TestGCRAUsable: a GCRA slice holds the units this instance reaches
// before their slots start, the time the bucket is ahead taken low (a unit
// less, the lease's 5 ms wait, the held units' time). A bucket of 100 a
// minute leaks one unit each 0.6 s.
func TestGCRAUsable(t *testing.T) {
	h := limiter.Hit{Algorithm: config.GCRA, Limit: 100, Window: time.Minute}
	for _, tc := range []struct {
		name      string
		remaining uint64
		known     bool
		since     time.Duration // since the answer
		rate      float64
		held      uint64
		want      uint64
	}{
		{"as fast as the bucket leaks", 100, true, 0, 100.0 / 60, 0, math.MaxUint64},
		{"faster, with the bucket empty", 100, true, 0, 10, 0, math.MaxUint64},
		{"slower, with the bucket empty", 100, true, 0, 1, 0, 0},
		{"slower, nothing known of the bucket", 0, false, 0, 1, 0, 0},
		// 0.6 s per unit ahead for each of 59 units (60 used, one less):
		// 35.4 s, less 5 ms; a unit each second, 0.4 s later than the
		// bucket's pace: 88 units.
		{"slower, the bucket 60 units full", 40, true, 0, 1, 0, 88},
		{"slower, the bucket full", 0, true, 0, 1, 0, 148},
		{"slower, the bucket full, 20 units held (20 s)", 0, true, 0, 1, 20, 98},
		{"slower, the bucket full when answered 20 s ago", 0, true, 20 * time.Second, 1, 0, 98},
		{"slower, more held than the bucket is ahead", 0, true, 0, 1, 100, 0},
		{"slower, answered longer ago than the bucket was ahead", 0, true, time.Minute, 1, 0, 0},
		{"no hit in the last second", 0, true, 0, 0, 0, 0},
	} {
		if got := gcraUsable(h, tc.remaining, tc.known, tc.since, tc.rate, tc.held); got != tc.want {
			t.Errorf("%s: %d usable, want %d", tc.name, got, tc.want)
		}
	}
}

// TestGCRAUsableAtThePace: at exactly the bucket's pace, where the emission
// interval times the rate rounds under one, every unit is usable.
func TestGCRAUsableAtThePace(t *testing.T) {
	h := limiter.Hit{Algorithm: config.GCRA, Limit: 49, Window: time.Second}
	if got := gcraUsable(h, 0, true, 0, 49, 0); got != math.MaxUint64 {
		t.Errorf("at 49 a second under a bucket of 49 a second: %d usable, want all", got)
	}
}
