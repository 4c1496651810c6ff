package e2e

// Waiting without guessing: the tests wait for a condition they can observe
// (polled with a deadline), for a known moment (a window's edge, an
// announced reset), or for a channel, not for a length of time that ought
// to be enough.

import (
	"strconv"
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

// inOneWindow calls hits until one call begins and ends in one fixed window
// of length window (windows as nextEdge counts them; Redis, the service and
// the test read the one machine's clock), and returns what that call
// returned: a call whose hits straddled an edge, where a fixed window's
// count starts again, is judged by nothing. hits gets its attempt, from 1,
// to name counters of its own, as a call that straddled an edge left its
// hits in those it named. Three calls in a row that straddled one fail t.
func inOneWindow[T any](t *testing.T, window time.Duration, hits func(attempt int) T) T {
	t.Helper()
	for attempt := 1; ; attempt++ {
		start := time.Now()
		got := hits(attempt)
		if end := time.Now(); start.Truncate(window).Equal(end.Truncate(window)) {
			return got
		}
		if attempt == 3 {
			t.Fatalf("three times in a row, the hits straddled the edge of a window of %v", window)
		}
		t.Logf("attempt %d straddled the edge of a window of %v: again, on counters of its own", attempt, window)
	}
}

// attemptValue is value on a first attempt of inOneWindow, and value
// suffixed with the attempt on the next ones.
func attemptValue(value string, attempt int) string {
	if attempt == 1 {
		return value
	}
	return value + "-" + strconv.Itoa(attempt)
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
