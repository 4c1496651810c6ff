package hotkeys

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

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
			if v, err := s.Decide(context.Background(), plain(hit)); err != nil || !v[0].Admitted {
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

// TestSlicePays: a window counter's slice is leased only when the key's
// rate is expected to decide sliceHitsToPay hits from it before its window
// ends, within its units: a lease and its give back cost the store what
// about two hits do. The rate is the averaged one, or the last second's
// count when that is a jump (jumpFrom): not a chance burst.
func TestSlicePays(t *testing.T) {
	second, minute := time.Second, time.Minute
	month := config.CalendarOf(config.FixedWindow, config.Month, 1, time.UTC)
	at := func(into time.Duration) time.Time { return epoch.Add(into) } // epoch starts every window
	for _, tc := range []struct {
		name         string
		hits, units  float64 // per second, averaged
		last         uint32  // hits (of one unit) in the last second
		window       time.Duration
		calendar     config.Calendar
		want         uint64
		now, liveEnd time.Time
		pays         bool
	}{
		{"a second's window at 3 hits a second", 3, 3, 0, second, config.Calendar{}, 4, at(0), time.Time{}, false},
		{"a second's window at 20 hits a second, its start", 20, 20, 0, second, config.Calendar{}, 10, at(0), time.Time{}, true},
		{"a second's window at 20 hits a second, its last 100 ms", 20, 20, 0, second, config.Calendar{}, 10, at(900 * time.Millisecond), time.Time{}, false},
		{"a minute's window at 3 hits a second", 3, 3, 0, minute, config.Calendar{}, 30, at(10 * time.Second), time.Time{}, true},
		{"a minute's window, its live slices ending in 500 ms", 3, 3, 0, minute, config.Calendar{}, 30, at(10 * time.Second), at(10*time.Second + 500*time.Millisecond), false},
		{"units for 3 hits of 10 units", 20, 200, 0, minute, config.Calendar{}, 30, at(0), time.Time{}, false},
		{"units for 4 hits of 10 units", 20, 200, 0, minute, config.Calendar{}, 40, at(0), time.Time{}, true},
		{"a month at 3 hits a second", 3, 3, 0, 30 * 24 * time.Hour, month, 30, at(0), time.Time{}, true},
		{"a second's window at 1.5 hits a second, 5 in the last (chance)", 1.5, 1.5, 5, second, config.Calendar{}, 4, at(0), time.Time{}, false},
		{"a second's window at 1.5 hits a second, 20 in the last (a jump)", 1.5, 1.5, 20, second, config.Calendar{}, 10, at(0), time.Time{}, true},
		{"a minute's window at 1.5 hits a second, 5 in the last", 1.5, 1.5, 5, minute, config.Calendar{}, 30, at(10 * time.Second), time.Time{}, true},
		{"a young key, no average yet, 5 in the last second", 0, 0, 5, second, config.Calendar{}, 4, at(0), time.Time{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &hotKey{after: 2, weight: 1, rate: tc.hits, unitRate: tc.units, prev: tc.last, prevUnits: uint64(tc.last)}
			if tc.hits == 0 {
				k.after, k.weight = 0, 0 // young: rates says nothing yet
			}
			h := limiter.Hit{Key: "{k}", Algorithm: config.SlidingWindowCounter, Limit: 1 << 30, Window: tc.window, Calendar: tc.calendar, Cost: 1}
			if got := pays(k, &h, tc.want, windowLeft(&h, tc.liveEnd, tc.now), sliceHitsToPay); got != tc.pays {
				t.Errorf("pays = %v, want %v", got, tc.pays)
			}
		})
	}
}
