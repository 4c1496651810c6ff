package hotkeys

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// warmHits sends hit to every instance every 2 s (half a hit a second at
// each, a warm key's rate), n times, ticking every instance each second,
// and returns the instants of the hits admitted and how many were decided
// on the store.
func (in *instances) warmHits(t *testing.T, hit limiter.Hit, n int) (admitted []time.Time, onStore int) {
	t.Helper()
	for range n {
		for _, s := range in.slices {
			local := in.local.Load()
			v, err := s.Decide(context.Background(), plain(hit))
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
// (5 units at half a hit a second), at least minSlice.
func TestSlicesWarmKey(t *testing.T) {
	for _, tc := range []struct {
		alg         config.Algorithm
		least, most uint64 // a slice's size: its rate is an average, young keys' a little high
	}{
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
			if sizes[len(sizes)-1] != 5 {
				t.Errorf("warm slices of %v units: want the last, at a steady half hit a second, of 5 (%s of demand)", sizes, warmSpan)
			}
			in.slices[0].Close()
			if used := in.local.Load() + in.back.Load(); used != in.leased.Load() {
				t.Errorf("%d units leased, %d used and %d given back", in.leased.Load(), in.local.Load(), in.back.Load())
			}
		})
	}
}

// TestSlicesWarmKeyOff: with the warm threshold off, for GCRA (whose
// units' emission slots a warm key would miss) and for the log (whose warm
// slices saved no Redis CPU), a key at half a hit a second is never leased.
func TestSlicesWarmKeyOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		alg  config.Algorithm
		warm float64
	}{
		{"off", config.FixedWindow, -1},
		{"above the hot threshold", config.FixedWindow, DefaultSliceThreshold},
		{"gcra", config.GCRA, 0},
		{"sliding_window_log", config.SlidingWindowLog, 0},
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
	for _, alg := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter} {
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
			// 4 units at 0.5/s: about 8 s after its last use.
			want := 8 * time.Second
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
		for _, alg := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter} {
			t.Run(fmt.Sprintf("%d/%v", n, alg), func(t *testing.T) {
				window := time.Minute
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
