package limiter

import (
	"testing"
	"time"
)

// TestLinger: only a small batch waits for more, and only while calls come
// about once a linger or faster.
func TestLinger(t *testing.T) {
	for _, tc := range []struct {
		name string
		hits int
		gap  time.Duration
		want bool
	}{
		{"busy, small batch", 2, batchLinger / 2, true},
		{"busy, one hit", 1, time.Microsecond, true},
		{"idle: calls a linger apart", 2, batchLinger, false},
		{"idle: calls a second apart", 2, time.Second, false},
		{"busy, batch large enough", lingerHits, time.Microsecond, false},
		{"nothing to send (every call had left)", 0, time.Microsecond, false},
	} {
		if got := linger(tc.hits, tc.gap); got != tc.want {
			t.Errorf("%s: linger %t, want %t", tc.name, got, tc.want)
		}
	}
}

// TestLingerEnd: a batch waits batchLinger at most, and never past the
// deadline of one of its calls.
func TestLingerEnd(t *testing.T) {
	now := time.Unix(1700000000, 0)
	at := func(d time.Duration) *call { return &call{deadline: now.Add(d)} }
	for _, tc := range []struct {
		name  string
		batch []*call
		want  time.Duration // after now
	}{
		{"deadlines far off", []*call{at(20 * time.Millisecond), at(time.Second)}, batchLinger},
		{"one deadline within the linger", []*call{at(20 * time.Millisecond), at(batchLinger / 4)}, batchLinger / 4},
		{"the earliest of two within it", []*call{at(batchLinger / 2), at(batchLinger / 4)}, batchLinger / 4},
		{"a deadline at the linger's end", []*call{at(batchLinger)}, batchLinger},
		{"a deadline passed while collecting", []*call{at(-time.Microsecond)}, -time.Microsecond},
	} {
		if got := lingerEnd(now, tc.batch).Sub(now); got != tc.want {
			t.Errorf("%s: lingers %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestArrivals: the average gap follows the pace of the calls, starts idle,
// and one call after a pause makes a busy queue idle again.
func TestArrivals(t *testing.T) {
	start := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name string
		gaps []time.Duration // between successive calls, after a first
		busy bool            // linger(1, gap) after them
	}{
		{"a first call: idle", nil, false},
		{"two calls at once: not yet busy (one gap, averaged with idle)", []time.Duration{0}, false},
		{"a steady call every 200us", repeat(200*time.Microsecond, 40), true},
		{"a steady call every 2ms", repeat(2*time.Millisecond, 40), false},
		{"busy, then a call after a second's pause", append(repeat(100*time.Microsecond, 40), time.Second), false},
		{"idle, then a burst of calls 10us apart", append([]time.Duration{time.Second}, repeat(10*time.Microsecond, 40)...), true},
		{"a call queued before the latest counts as no gap", append(repeat(100*time.Microsecond, 40), -time.Millisecond), true},
		{"after a pause, calls reaching the collector out of their order: busy", append([]time.Duration{time.Second}, repeat(-10*time.Microsecond, 40)...), true},
	} {
		var a arrivals
		at := start
		a.saw(at)
		for _, g := range tc.gaps {
			at = at.Add(g)
			a.saw(at)
			if g < 0 {
				at = at.Add(-g) // the latest stays the latest
			}
		}
		if got := linger(1, a.gap); got != tc.busy {
			t.Errorf("%s: average gap %v, linger %t, want %t", tc.name, a.gap, got, tc.busy)
		}
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = d
	}
	return s
}
