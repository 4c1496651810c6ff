package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// algorithms are those whose window Redis's clock places, which the tests
// move; reference_fixed_window's is in its key, from the Go side's clock
// (reference_test.go).
var algorithms = []config.Algorithm{config.SlidingWindowLog, config.SlidingWindowCounter, config.FixedWindow, config.GCRA}

// clock is a frozen Redis TIME: tests move it by hand.
type clock struct {
	m   *miniredis.Miniredis
	now time.Time
}

func (c *clock) set(t time.Time) {
	c.now = t
	c.m.SetTime(t)
}

func (c *clock) add(d time.Duration) { c.set(c.now.Add(d)) }

// newTestLimiter returns a limiter on a fresh miniredis whose clock starts
// at start.
func newTestLimiter(t *testing.T, start time.Time) (*Limiter, *clock) {
	t.Helper()
	m, _ := luastore.RunT(t)
	// A dial is tried once (go-redis's default is five, 100 ms apart): the
	// tests that stop the store wait for its failure, not for retries.
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	c := &clock{m: m}
	c.set(start)
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1}) // tests move Redis's clock
	t.Cleanup(l.Close)
	return l, c
}

// epoch is aligned to every window the tests use, so a test knows where the
// fixed windows start.
var epoch = time.Unix(1_700_006_400, 0) // divisible by 3600 and 60

// hit is a hit of a on key; an algorithm with the reference's keys gets
// one of epoch's window.
func hit(a config.Algorithm, key string, limit uint32, window time.Duration, cost uint64) Hit {
	b := KeyBuilder{Now: epoch}
	if a.ReferenceKeys() {
		b.ResetReference("test")
	} else {
		b.Reset("test")
	}
	b.Add("k", key)
	return Hit{Key: b.Key(a, window), Algorithm: a, Limit: limit, Window: window, Cost: cost}
}

func decide1(t *testing.T, l *Limiter, h Hit) Verdict {
	t.Helper()
	v, err := l.Decide(context.Background(), []Hit{h})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return v[0]
}

func TestAdmitsUpToLimit(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(10*time.Second))
			h := hit(a, "u", 5, time.Minute, 1)
			for i := 1; i <= 5; i++ {
				v := decide1(t, l, h)
				if !v.Admitted || !v.Charged || v.Remaining != uint64(5-i) {
					t.Fatalf("hit %d: %+v, want admitted, charged, remaining %d", i, v, 5-i)
				}
				c.add(time.Millisecond)
			}
			v := decide1(t, l, h)
			if v.Admitted || v.Charged || v.Remaining != 0 {
				t.Fatalf("hit 6: %+v, want denied, not charged, remaining 0", v)
			}
		})
	}
}

// TestBoundaryBurst is the seeds' demonstration: a full burst just before a
// window edge and another just after. The fixed window admits twice the
// limit, the log exactly the limit, the counter close to it. GCRA knows no
// edge: its bucket of limit units admits the first burst whole, and of the
// second what refilled in the 2 s between them (limit / 5).
func TestBoundaryBurst(t *testing.T) {
	const limit = 50
	window := 10 * time.Second
	want := map[config.Algorithm]func(int) bool{
		config.FixedWindow:          func(n int) bool { return n == 2*limit },
		config.SlidingWindowLog:     func(n int) bool { return n == limit },
		config.SlidingWindowCounter: func(n int) bool { return n >= limit && n <= limit+limit/10 },
		config.GCRA:                 func(n int) bool { return n == limit+limit/5 },
	}
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(-time.Second))
			h := hit(a, "burst", limit, window, 1)
			admitted := 0
			for _, at := range []time.Time{epoch.Add(-time.Second), epoch.Add(time.Second)} {
				c.set(at)
				for i := 0; i < limit; i++ {
					if decide1(t, l, h).Admitted {
						admitted++
					}
					c.add(time.Microsecond)
				}
			}
			t.Logf("%s admitted %d of %d across the edge (limit %d per %s)", a, admitted, 2*limit, limit, window)
			if !want[a](admitted) {
				t.Fatalf("%s admitted %d", a, admitted)
			}
		})
	}
}

// TestRetryAfterIsExact checks the wait a denied hit is told: retrying right
// at it is admitted, retrying a millisecond before it is not.
func TestRetryAfterIsExact(t *testing.T) {
	type step struct {
		after time.Duration // since the previous step
		cost  uint64
	}
	cases := []struct {
		name  string
		limit uint32
		steps []step // all admitted; the probe with cost comes after them
		cost  uint64
	}{
		{"spread", 5, []step{{0, 1}, {7 * time.Second, 1}, {9 * time.Second, 2}, {13 * time.Second, 1}}, 1},
		{"weighted", 10, []step{{0, 4}, {20 * time.Second, 3}, {5 * time.Second, 3}}, 5},
		{"burst", 3, []step{{0, 3}}, 3},
		{"across windows", 4, []step{{0, 2}, {40 * time.Second, 2}, {50 * time.Second, 1}}, 2},
	}
	for _, a := range algorithms {
		for _, tc := range cases {
			t.Run(a.String()+"/"+tc.name, func(t *testing.T) {
				l, c := newTestLimiter(t, epoch.Add(3*time.Second))
				for i, s := range tc.steps {
					c.add(s.after)
					if v := decide1(t, l, hit(a, "r", tc.limit, time.Minute, s.cost)); !v.Admitted {
						t.Fatalf("step %d not admitted: %+v", i, v)
					}
				}
				probe := hit(a, "r", tc.limit, time.Minute, tc.cost)
				// Deny at least once so there is a wait to check.
				var v Verdict
				for v = decide1(t, l, probe); v.Admitted; v = decide1(t, l, probe) {
					c.add(time.Second)
				}
				wait := v.ResetAfter
				if wait <= 0 {
					t.Fatalf("denied with wait %v", wait)
				}
				denied := c.now
				c.set(denied.Add(wait - time.Millisecond))
				if early := decide1(t, l, probe); early.Admitted && wait > time.Millisecond {
					t.Fatalf("admitted 1ms before the announced wait %v", wait)
				}
				c.set(denied.Add(wait))
				if v := decide1(t, l, probe); !v.Admitted {
					t.Fatalf("denied at the announced wait %v: %+v", wait, v)
				}
			})
		}
	}
}

func TestZeroCostChecksWithoutConsuming(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			if v := decide1(t, l, hit(a, "z", 3, time.Minute, 0)); !v.Admitted || v.Remaining != 3 || v.ResetAfter != 0 {
				t.Fatalf("check of an empty counter: %+v, want whole (3 left) now", v)
			}
			decide1(t, l, hit(a, "z", 3, time.Minute, 2))
			for i := 0; i < 3; i++ {
				v := decide1(t, l, hit(a, "z", 3, time.Minute, 0))
				if !v.Admitted || v.Charged || v.Remaining != 1 {
					t.Fatalf("check %d: %+v, want admitted, not charged, remaining 1", i, v)
				}
			}
		})
	}
}

// TestLogMembersStayUnique: hits in the same microsecond, and a clock that
// steps back, must still each be recorded.
func TestLogMembersStayUnique(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowLog, "same", 10, time.Minute, 1)
	for i := 0; i < 3; i++ {
		decide1(t, l, h)
	}
	c.add(-time.Second)
	decide1(t, l, hit(config.SlidingWindowLog, "same", 10, time.Minute, 3))
	if v := decide1(t, l, hit(config.SlidingWindowLog, "same", 10, time.Minute, 0)); v.Remaining != 4 {
		t.Fatalf("remaining %d, want 4 (six hits recorded)", v.Remaining)
	}
}

// TestCounterWaitIsTheFirstMicrosecond: prev 3, curr 1, limit 4, cost 1 in a
// 3 s window fits exactly at 1 s elapsed, where float solving gives 1 s + 1 µs.
func TestCounterWaitIsTheFirstMicrosecond(t *testing.T) {
	window := 3 * time.Second
	start := time.Unix(1_700_000_001, 0) // a multiple of 3 s
	l, c := newTestLimiter(t, start)
	h := hit(config.SlidingWindowCounter, "µs", 4, window, 3)
	decide1(t, l, h) // previous window: 3
	c.set(start.Add(window + 200*time.Millisecond))
	decide1(t, l, hit(config.SlidingWindowCounter, "µs", 4, window, 1)) // current: 1
	v := decide1(t, l, hit(config.SlidingWindowCounter, "µs", 4, window, 1))
	if v.Admitted || v.ResetAfter != 800*time.Millisecond {
		t.Fatalf("verdict %+v, want denied with a wait of exactly 800ms", v)
	}
	c.add(v.ResetAfter - time.Microsecond)
	if decide1(t, l, hit(config.SlidingWindowCounter, "µs", 4, window, 1)).Admitted {
		t.Fatal("admitted a microsecond before the wait")
	}
	c.add(time.Microsecond)
	if !decide1(t, l, hit(config.SlidingWindowCounter, "µs", 4, window, 1)).Admitted {
		t.Fatal("denied at the wait")
	}
}
