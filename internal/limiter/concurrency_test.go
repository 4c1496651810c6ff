package limiter

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// A concurrency limit as Envoy drives it (docs/budgets.md, "Concurrency
// limits"): an acquisition before routing, a cost of 1 in the descriptor's
// own hits_addend, so recorded even past the limit; a release when the
// stream is done, is_negative_hits, sent for denied acquisitions too. The
// log's window is the longest a request may run.

func acquisition(key string, limit uint32, window time.Duration) Hit {
	return recorded(config.SlidingWindowLog, key, limit, window, 1)
}

func release(key string, limit uint32, window time.Duration, oldest bool) Hit {
	h := refund(config.SlidingWindowLog, key, limit, window, 1)
	h.RefundOldest = oldest
	return h
}

// seatsLeft is what a check (cost 0, which records nothing) says remains.
func seatsLeft(t *testing.T, l *Limiter, key string, limit uint32, window time.Duration) uint64 {
	t.Helper()
	return decide1(t, l, hit(config.SlidingWindowLog, key, limit, window, 0)).Remaining
}

// steadyTraffic drives a concurrency limit of 3 with a 10 s window: a
// request every 700 ms for a minute, each admitted one held 2.3 s (less than
// the window), each denied one released at once, as Envoy does after its
// 429. It returns the most requests admitted and in flight at once, and how
// many were admitted and denied.
func steadyTraffic(t *testing.T, oldest bool) (most, admitted, denied int) {
	const limit, window, every, hold = 3, 10 * time.Second, 700 * time.Millisecond, 2300 * time.Millisecond
	l, c := newTestLimiter(t, epoch)
	var ends []time.Time // the admitted requests' releases, in order
	for now := epoch; now.Before(epoch.Add(6 * window)); now = now.Add(every) {
		for len(ends) > 0 && !ends[0].After(now) {
			c.set(ends[0])
			decide1(t, l, release("seat", limit, window, oldest))
			ends = ends[1:]
		}
		c.set(now)
		v := decide1(t, l, acquisition("seat", limit, window))
		if !v.Charged {
			t.Fatalf("acquisition at %v: %+v, want charged (recorded) whether admitted or not", now.Sub(epoch), v)
		}
		if !v.Admitted {
			denied++
			decide1(t, l, release("seat", limit, window, oldest))
			continue
		}
		admitted++
		ends = append(ends, now.Add(hold))
		most = max(most, len(ends))
	}
	return most, admitted, denied
}

// TestConcurrencyLimitUnderSteadyTraffic: refund_order oldest keeps a
// concurrency limit exact however long the traffic lasts. Removing the
// newest member instead (the default refund order, right for budgets) leaves
// old members behind while the key is never idle; they leave the window
// while requests still hold the seats they stand for, and more than the
// limit are admitted.
func TestConcurrencyLimitUnderSteadyTraffic(t *testing.T) {
	most, admitted, denied := steadyTraffic(t, true)
	if most != 3 || admitted == 0 || denied == 0 {
		t.Fatalf("oldest first: at most %d in flight (%d admitted, %d denied), want exactly the limit 3, reached, and denials", most, admitted, denied)
	}
	t.Logf("oldest first: at most %d in flight, %d admitted, %d denied", most, admitted, denied)
	most, admitted, denied = steadyTraffic(t, false)
	t.Logf("newest first: at most %d in flight, %d admitted, %d denied", most, admitted, denied)
	if most <= 3 {
		t.Fatalf("newest first: at most %d in flight; the test no longer shows why releases take the oldest seat", most)
	}
}

// TestDeniedAcquisitionTakesASeatUntilItsRelease: a denied acquisition is
// recorded, answered OVER_LIMIT, and its release (which Envoy sends for every
// request whose headers it decoded) gives that seat back, not another one.
func TestDeniedAcquisitionTakesASeatUntilItsRelease(t *testing.T) {
	const limit, window = 2, time.Minute
	l, c := newTestLimiter(t, epoch)
	for i, want := range []struct {
		admitted  bool
		remaining uint64
	}{{true, 1}, {true, 0}, {false, 0}, {false, 0}} {
		v := decide1(t, l, acquisition("s", limit, window))
		if v.Admitted != want.admitted || !v.Charged || v.Remaining != want.remaining {
			t.Fatalf("acquisition %d: %+v, want admitted %v, charged, %d remaining", i+1, v, want.admitted, want.remaining)
		}
		c.add(time.Millisecond)
	}
	// The two denied requests' releases: the two admitted still hold theirs.
	for i := range 2 {
		decide1(t, l, release("s", limit, window, true))
		c.add(time.Millisecond)
		if v := decide1(t, l, acquisition("s", limit, window)); v.Admitted {
			t.Fatalf("acquisition after %d denied released: %+v, want denied: both seats are held", i+1, v)
		}
		decide1(t, l, release("s", limit, window, true)) // that denied one's
	}
	decide1(t, l, release("s", limit, window, true)) // an admitted one ends
	if v := decide1(t, l, acquisition("s", limit, window)); !v.Admitted || v.Remaining != 0 {
		t.Fatalf("acquisition after an admitted request ended: %+v, want admitted, 0 remaining", v)
	}
}

// TestDeniedSeatsAreTheLeastAnExactCountHolds: a release cannot say whether
// its request was admitted, so an exact count must assume the most requests
// still in flight that the calls seen allow: each release is a denied
// request's when one acquired earlier has not been released yet, else an
// admitted one's. That is a credit a denial adds, which a release takes
// before it frees a seat. Holding a seat per denied acquisition until a
// release comes decides every acquisition as that most does: admitted
// exactly when fewer than the limit may be in flight. So no exact scheme
// with such releases admits more (a credit instead of a seat, tried in
// issue 24, decides alike: a denial adds a credit only while every seat is
// taken, and no seat is freed until the credits are gone). Random
// interleavings of acquisitions and releases, each release of a request
// acquired before it.
func TestDeniedSeatsAreTheLeastAnExactCountHolds(t *testing.T) {
	const window = time.Minute
	admitted, denied := 0, 0
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 24))
		limit := 1 + r.IntN(4)
		l, c := newTestLimiter(t, epoch)
		// mayRun: the most admitted requests that may still run; credits:
		// the denied ones that may not have been released yet.
		mayRun, credits, unreleased := 0, 0, 0
		for step := range 200 {
			c.add(time.Millisecond)
			if unreleased > 0 && r.IntN(2) == 0 {
				decide1(t, l, release("m", uint32(limit), window, true))
				unreleased--
				if credits > 0 {
					credits--
				} else {
					mayRun--
				}
				continue
			}
			v := decide1(t, l, acquisition("m", uint32(limit), window))
			unreleased++
			if v.Admitted != (mayRun < limit) {
				t.Fatalf("seed %d, step %d, limit %d: %+v with %d requests that may run", seed, step, limit, v, mayRun)
			}
			if v.Admitted {
				mayRun++
				admitted++
			} else {
				credits++
				denied++
			}
		}
	}
	if admitted == 0 || denied == 0 {
		t.Fatalf("%d admitted, %d denied: the interleavings no longer reach the limit", admitted, denied)
	}
	t.Logf("%d admitted, %d denied", admitted, denied)
}

// TestLostReleaseFreesItsSeat: a seat whose release never comes (Envoy
// crashed, the stream-done call failed) is held one window after the key's
// last acquisition, then free; while acquisitions keep coming it stays taken,
// since a release cannot say which seat it frees.
func TestLostReleaseFreesItsSeat(t *testing.T) {
	const limit, window = 2, 10 * time.Second
	t.Run("idle key", func(t *testing.T) {
		l, c := newTestLimiter(t, epoch)
		decide1(t, l, acquisition("lost", limit, window)) // never released
		c.add(window - time.Millisecond)
		if got := seatsLeft(t, l, "lost", limit, window); got != 1 {
			t.Fatalf("a millisecond before one window: %d seats left, want 1", got)
		}
		c.add(time.Millisecond)
		if got := seatsLeft(t, l, "lost", limit, window); got != 2 {
			t.Fatalf("one window after the acquisition: %d seats left, want 2", got)
		}
	})
	t.Run("busy key", func(t *testing.T) {
		l, c := newTestLimiter(t, epoch)
		decide1(t, l, acquisition("lost", limit, window)) // never released
		last := epoch
		for i := 1; i <= 30; i++ { // a request a second, each done in 500 ms
			last = epoch.Add(time.Duration(i) * time.Second)
			c.set(last)
			if v := decide1(t, l, acquisition("lost", limit, window)); !v.Admitted || v.Remaining != 0 {
				t.Fatalf("request %d: %+v, want admitted with 0 left: the lost seat and its own", i, v)
			}
			c.add(500 * time.Millisecond)
			decide1(t, l, release("lost", limit, window, true))
		}
		c.set(last.Add(window - time.Millisecond))
		if got := seatsLeft(t, l, "lost", limit, window); got != 1 {
			t.Fatalf("a millisecond before one window after the last acquisition: %d seats left, want 1", got)
		}
		c.set(last.Add(window))
		if got := seatsLeft(t, l, "lost", limit, window); got != 2 {
			t.Fatalf("one window after the last acquisition: %d seats left, want 2", got)
		}
	})
}

// TestReleaseWithoutAcquisition: an acquisition that failed before Redis
// counted it (Envoy's failure mode allow lets the request through, and its
// release still comes) frees a seat it never took: one more is admitted
// until the key has no seat held, where the surplus release finds nothing
// to give back (a refund never goes below zero) and the count is exact again.
func TestReleaseWithoutAcquisition(t *testing.T) {
	const limit, window = 2, time.Minute
	l, c := newTestLimiter(t, epoch)
	step := func() { c.add(time.Millisecond) }
	decide1(t, l, acquisition("d", limit, window)) // A
	step()
	decide1(t, l, release("d", limit, window, true)) // the failed acquisition's release
	step()
	for _, name := range []string{"B", "C"} {
		if v := decide1(t, l, acquisition("d", limit, window)); !v.Admitted {
			t.Fatalf("%s: %+v: the drift no longer shows", name, v)
		}
		step()
	}
	// A, B and C are in flight: one over the limit. They end.
	for range 3 {
		decide1(t, l, release("d", limit, window, true))
		step()
	}
	var got []bool
	for range 3 {
		got = append(got, decide1(t, l, acquisition("d", limit, window)).Admitted)
		step()
	}
	if want := []bool{true, true, false}; !slices.Equal(got, want) {
		t.Fatalf("after the key was idle: admitted %v, want %v: exact again", got, want)
	}
}

// TestOtherAlgorithmsForgetSeatsInFlight is why refund_order is the log's:
// the other algorithms free units by time alone, while the requests holding
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

// TestRefundOrderIsTheLogsOnly: the flag changes nothing for the algorithms
// whose counts have no order; their refunds give back the cost as before.
func TestRefundOrderIsTheLogsOnly(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(time.Second))
			decide1(t, l, hit(a, "o", 5, time.Minute, 4))
			c.add(time.Second)
			h := refund(a, "o", 5, time.Minute, 3)
			h.RefundOldest = true
			if v := decide1(t, l, h); !v.Admitted || v.Remaining != 4 {
				t.Fatalf("refund of 3 of 4, oldest first: %+v, want 4 remaining", v)
			}
		})
	}
}
