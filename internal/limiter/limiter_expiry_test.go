package limiter

import (
	"strconv"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestKeysExpireWithTheWindow: an idle key disappears once it cannot matter.
func TestKeysExpireWithTheWindow(t *testing.T) {
	cases := []struct {
		a       config.Algorithm
		wantTTL time.Duration // from 15 s into a one-minute window
	}{
		{config.SlidingWindowLog, time.Minute},
		{config.SlidingWindowCounter, 2*time.Minute - 15*time.Second},
		{config.FixedWindow, time.Minute - 15*time.Second},
		{config.GCRA, 12 * time.Second}, // one unit of a bucket refilling 5 per minute
	}
	for _, tc := range cases {
		t.Run(tc.a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(15*time.Second))
			decide1(t, l, hit(tc.a, "ttl", 5, time.Minute, 1))
			keys := c.m.Keys()
			if len(keys) != 1 {
				t.Fatalf("keys %q, want one", keys)
			}
			if ttl := c.m.TTL(keys[0]); ttl != tc.wantTTL {
				t.Fatalf("TTL %v, want %v", ttl, tc.wantTTL)
			}
			c.m.FastForward(tc.wantTTL)
			if keys := c.m.Keys(); len(keys) != 0 {
				t.Fatalf("keys %q left after their TTL", keys)
			}
		})
	}
}

// TestLogExpiryFollowsNewestHit: a log key's first hit sets its expiry, and
// each later one moves it to a window past that hit.
func TestLogExpiryFollowsNewestHit(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowLog, "log", 5, time.Minute, 1)
	for i := range 3 {
		decide1(t, l, h)
		keys := c.m.Keys()
		if len(keys) != 1 {
			t.Fatalf("hit %d: keys %q, want one", i, keys)
		}
		if ttl := c.m.TTL(keys[0]); ttl != time.Minute {
			t.Fatalf("hit %d: TTL %v, want a minute", i, ttl)
		}
		c.add(20 * time.Second)
		c.m.FastForward(20 * time.Second)
	}
}

// TestLogKeyOutlivesItsNewestMember: after Redis's clock stepped back, a new
// hit must not cut the life of a key holding a newer member. (miniredis keeps
// TTLs as durations that its clock does not move, so the state a step back
// leaves is built directly: a member 5 s ahead of TIME, the key living 7 s.)
func TestLogKeyOutlivesItsNewestMember(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowLog, "back", 5, 2*time.Second, 1)
	ahead := strconv.FormatInt(epoch.Add(5*time.Second).UnixMicro(), 10)
	if _, err := c.m.ZAdd(h.Key, float64(epoch.Add(5*time.Second).UnixMicro()), ahead); err != nil {
		t.Fatal(err)
	}
	c.m.SetTTL(h.Key, 7*time.Second)
	decide1(t, l, h)
	if ttl := c.m.TTL(h.Key); ttl != 7*time.Second {
		t.Fatalf("TTL %v after a hit behind the newest member, want its 7 s kept", ttl)
	}
	// A key's first hit still gets its window.
	fresh := hit(config.SlidingWindowLog, "fresh", 5, 2*time.Second, 1)
	decide1(t, l, fresh)
	if ttl := c.m.TTL(fresh.Key); ttl != 2*time.Second {
		t.Fatalf("TTL %v for a new key, want 2s", ttl)
	}
}
