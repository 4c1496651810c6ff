package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestSliceGivesBackOnlyWhatTheStoreHolds leases a slice of 5 units (a hit
// with Ahead) of each window counter and GCRA, and gives 5 back after what
// a store can do to a lease meanwhile: nothing (all 5 come back), a give
// back already made (none), a failover that lost the lease's write, and a
// Reset (none: other instances charged the count since, and a give back of
// a lease the count no longer holds would take their units).
func TestSliceGivesBackOnlyWhatTheStoreHolds(t *testing.T) {
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.GCRA} {
		for _, tc := range []struct {
			name string
			// between happens to the store after the lease (of token);
			// before is the counter's value before it.
			between func(t *testing.T, l *Limiter, c *clock, h Hit, token int64, before string)
			back    uint64
		}{
			{"kept", func(*testing.T, *Limiter, *clock, Hit, int64, string) {}, 5},
			{"given back before", func(t *testing.T, l *Limiter, _ *clock, h Hit, token int64, _ string) {
				// The same lease given back twice: only the first counts.
				giveBack(t, l, Return{Hit: h, Token: token, Units: 5})
			}, 0},
			{"lost by a failover", func(t *testing.T, _ *Limiter, c *clock, h Hit, _ int64, before string) {
				// A replica that missed the lease's call: the count as it
				// was, and no record (one call's writes replicate together).
				if before == "" {
					c.m.Del(h.Key)
				} else if err := c.m.Set(h.Key, before); err != nil {
					t.Fatal(err)
				}
				c.m.Del(h.Key + ":slices")
			}, 0},
			{"reset", func(t *testing.T, l *Limiter, _ *clock, h Hit, _ int64, _ string) {
				reset1(t, l, h)
			}, 0},
		} {
			t.Run(a.String()+"/"+tc.name, func(t *testing.T) {
				l, c := newTestLimiter(t, epoch)
				h := hit(a, "slice", 100, time.Minute, 5)
				h.Ahead = time.Second
				before, _ := c.m.Get(h.Key)
				v := decide1(t, l, h)
				if !v.Charged || v.Token >= 0 {
					t.Fatalf("the lease: %+v, want charged, with a record's (negative) token", v)
				}
				tc.between(t, l, c, h, v.Token, before)
				// Other instances charge 2 after it.
				other := hit(a, "slice", 100, time.Minute, 2)
				decide1(t, l, other)
				check := other
				check.Cost = 0
				was := decide1(t, l, check).Remaining

				if n := giveBack(t, l, Return{Hit: h, Token: v.Token, Units: 5}); n != tc.back {
					t.Errorf("gave back %d units, want %d", n, tc.back)
				}
				if got := decide1(t, l, check).Remaining; got != was+tc.back {
					t.Errorf("remaining %d after the give back, want %d + %d", got, was, tc.back)
				}
			})
		}
	}
}

func giveBack(t *testing.T, l *Limiter, r Return) uint64 {
	t.Helper()
	n, err := l.GiveBack(context.Background(), []Return{r})
	if err != nil {
		t.Fatalf("GiveBack: %v", err)
	}
	return n
}
