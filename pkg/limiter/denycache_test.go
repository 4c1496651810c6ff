package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/pkg/config"
)

// newCachingLimiter runs on a miniredis that keeps real time, as the deny
// cache does.
func newCachingLimiter(t *testing.T, maxAge time.Duration) (*Limiter, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: maxAge})
	t.Cleanup(l.Close)
	return l, m
}

func TestDeniedHitsAreAnsweredFromMemory(t *testing.T) {
	l, m := newCachingLimiter(t, time.Second)
	full := hit(config.SlidingWindowLog, "full", 2, time.Hour, 1)
	decide1(t, l, full)
	decide1(t, l, full)
	denied := decide1(t, l, full) // Redis denies: the wait is about an hour
	if denied.Admitted {
		t.Fatal("a third hit on a limit of 2 was admitted")
	}
	before := m.CommandCount()
	cached := decide1(t, l, full)
	if n := m.CommandCount() - before; n != 0 {
		t.Fatalf("%d store commands for a hit Redis just denied, want none", n)
	}
	if cached.Admitted || cached.ResetAfter < denied.ResetAfter-time.Second || cached.ResetAfter > denied.ResetAfter {
		t.Fatalf("cached verdict %+v: want a denial with Redis's own wait (%v) counting down, not the cache's 1s", cached, denied.ResetAfter)
	}

	// Not covered: a smaller cost, another limit (a reload), a shadow hit.
	for _, h := range []Hit{
		hit(config.SlidingWindowLog, "full", 2, time.Hour, 0),
		hit(config.SlidingWindowLog, "full", 3, time.Hour, 1),
		func() Hit { h := full; h.Shadow = true; return h }(),
	} {
		before := m.CommandCount()
		decide1(t, l, h)
		if m.CommandCount() == before {
			t.Errorf("hit %+v answered from memory, want Redis asked", h)
		}
	}
	// A reset forgets.
	if _, err := l.Reset(context.Background(), full); err != nil {
		t.Fatal(err)
	}
	if v := decide1(t, l, full); !v.Admitted {
		t.Fatalf("after Reset: %+v", v)
	}
}

func TestDeniedHitsAreForgottenAfterMaxAge(t *testing.T) {
	l, m := newCachingLimiter(t, 100*time.Millisecond)
	full := hit(config.FixedWindow, "full", 1, time.Hour, 1)
	decide1(t, l, full)
	decide1(t, l, full) // denied, cached for 100ms
	time.Sleep(150 * time.Millisecond)
	before := m.CommandCount()
	decide1(t, l, full)
	if m.CommandCount() == before {
		t.Fatal("a denial was repeated from memory past the cache's bound")
	}
}

// TestACachedDenialChargesNothingElse: all or nothing holds when the denial
// comes from memory; the other hits are checked, not charged.
func TestACachedDenialChargesNothingElse(t *testing.T) {
	l, _ := newCachingLimiter(t, time.Second)
	full := hit(config.FixedWindow, "full", 1, time.Hour, 1)
	other := hit(config.FixedWindow, "other", 10, time.Hour, 1)
	decide1(t, l, full)
	decide1(t, l, full)
	v, err := l.Decide(context.Background(), []Hit{other, full})
	if err != nil || v[1].Admitted || !v[0].Admitted || v[0].Charged || v[0].Remaining != 10 {
		t.Fatalf("verdicts %+v, %v: want the other hit checked (10 left), not charged", v, err)
	}
}
