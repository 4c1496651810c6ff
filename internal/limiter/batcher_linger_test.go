package limiter

import (
	"testing"
	"time"
)

// TestLinger: only a busy worker's small batch waits for more; an idle
// worker's, a first batch and a full one go at once.
func TestLinger(t *testing.T) {
	now := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name     string
		hits     int
		lastSent time.Time
		want     bool
	}{
		{"busy, small batch", 2, now.Add(-batchLinger / 2), true},
		{"busy, one hit", 1, now.Add(-time.Microsecond), true},
		{"idle: last batch a linger ago", 2, now.Add(-batchLinger), false},
		{"idle: last batch long ago", 2, now.Add(-time.Second), false},
		{"the worker's first batch", 2, time.Time{}, false},
		{"busy, batch large enough", lingerHits, now.Add(-time.Microsecond), false},
		{"nothing to send (every call had left)", 0, now.Add(-time.Microsecond), false},
	} {
		if got := linger(tc.hits, tc.lastSent, now); got != tc.want {
			t.Errorf("%s: linger %t, want %t", tc.name, got, tc.want)
		}
	}
}
