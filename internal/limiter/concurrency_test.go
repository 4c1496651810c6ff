package limiter

import (
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Seats as recorded costs: an acquisition, a cost of 1 in the
// descriptor's own hits_addend, so recorded even past the limit; a release,
// is_negative_hits. (A concurrency limit names its seats by lease id: see
// lease_test.go.)

func acquisition(key string, limit uint32, window time.Duration) Hit {
	return recorded(config.SlidingWindowLog, key, limit, window, 1)
}

func release(key string, limit uint32, window time.Duration) Hit {
	return refund(config.SlidingWindowLog, key, limit, window, 1)
}

// seatsLeft is what a check (cost 0, which records nothing) says remains.
func seatsLeft(t *testing.T, l *Limiter, key string, limit uint32, window time.Duration) uint64 {
	t.Helper()
	return decide1(t, l, hit(config.SlidingWindowLog, key, limit, window, 0)).Remaining
}

// TestOtherAlgorithmsForgetSeatsInFlight is why leases are the log's: the
// other algorithms free units by time alone, while the requests holding
// them still run. Two seats of two are taken 9 s into a 10 s window; 6 s
// later (the requests still in flight, shorter than the window) a third
// request is admitted.
func TestOtherAlgorithmsForgetSeatsInFlight(t *testing.T) {
	const limit, window = 2, 10 * time.Second
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(9*time.Second))
			for i := range 2 {
				if v := decide1(t, l, recorded(a, "f", limit, window, 1)); !v.Admitted {
					t.Fatalf("acquisition %d: %+v", i+1, v)
				}
			}
			c.add(6 * time.Second)
			if v := decide1(t, l, recorded(a, "f", limit, window, 1)); !v.Admitted {
				t.Fatalf("%s kept the seats of requests in flight: %+v; docs/budgets.md says it does not", a, v)
			}
		})
	}
}
