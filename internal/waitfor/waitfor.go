// Package waitfor polls, in tests, for a condition nothing signals: every
// test package that waits for one uses these instead of sleeping or keeping
// its own loop. Timeouts are generous bounds on what should happen, never
// latency targets: a busy machine must not fail a test.
package waitfor

import (
	"testing"
	"time"
)

// True calls cond every interval until it reports true or timeout has
// passed, and returns its last answer.
func True(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

// NoError calls check every interval until it returns nil, and fails t with
// what and check's last error if that takes longer than timeout.
func NoError(t testing.TB, timeout, interval time.Duration, what string, check func() error) {
	t.Helper()
	var err error
	if !True(timeout, interval, func() bool { err = check(); return err == nil }) {
		t.Fatalf("%s: not so after %v: %v", what, timeout, err)
	}
}
