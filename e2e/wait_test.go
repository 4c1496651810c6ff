package e2e

// Waiting without guessing: the tests wait for a condition they can observe
// (polled with a deadline), for a known moment (a window's edge, an
// announced reset), or for a channel, not for a length of time that ought
// to be enough.

import (
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// pollEvery is how often waitFor and eventually look again.
const pollEvery = 20 * time.Millisecond

// waitFor calls ready until it returns nil, and fails the test with ready's
// last error if that takes longer than timeout.
func waitFor(t *testing.T, timeout time.Duration, ready func() error) {
	t.Helper()
	waitfor.NoError(t, timeout, pollEvery, "ready", ready)
}

// eventually calls cond until it returns true, for at most timeout, and
// says whether it did. It fails nothing: the caller's own assertions judge
// what happened when the condition never came.
func eventually(timeout time.Duration, cond func() bool) bool {
	return waitfor.True(timeout, pollEvery, cond)
}

// waitUntil returns at the moment at (at once if it has passed): for a
// boundary the test knows, such as a window's edge or the end of an
// announced wait, where the clock itself is the condition.
func waitUntil(at time.Time) {
	d := time.Until(at)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// nextEdge is when the current window of length window ends: windows are
// counted from the zero time, so a day's ends at midnight UTC.
func nextEdge(window time.Duration) time.Time {
	return time.Now().Truncate(window).Add(window)
}

// pause paces a load generator: it waits d, or returns early once done is
// closed, and says whether the load should go on.
func pause(done <-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return false
	case <-timer.C:
		return true
	}
}
