package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

func TestAllOrNothing(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(time.Second))
			free := hit(a, "free", 10, time.Minute, 1)
			full := hit(a, "full", 1, time.Minute, 1)
			if v := decide1(t, l, full); !v.Admitted {
				t.Fatalf("first hit on full: %+v", v)
			}
			c.add(time.Second)
			v, err := l.Decide(context.Background(), []Hit{free, full})
			if err != nil {
				t.Fatal(err)
			}
			if !v[0].Admitted || v[0].Charged || v[0].Remaining != 10 {
				t.Fatalf("free hit: %+v, want admitted, not charged, remaining 10", v[0])
			}
			if v[1].Admitted || v[1].Charged {
				t.Fatalf("full hit: %+v, want denied", v[1])
			}
			// Nothing was charged: the free counter still has all 10.
			for i := 0; i < 10; i++ {
				if v := decide1(t, l, free); !v.Admitted {
					t.Fatalf("free hit %d denied after an all-or-nothing denial: %+v", i, v)
				}
			}
		})
	}
}

func TestShadowHitNeverDenies(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			enforced := hit(a, "enforced", 10, time.Minute, 1)
			shadow := hit(a, "shadow", 1, time.Minute, 1)
			shadow.Shadow = true
			for i := 0; i < 3; i++ {
				v, err := l.Decide(context.Background(), []Hit{enforced, shadow})
				if err != nil {
					t.Fatal(err)
				}
				if !v[0].Charged {
					t.Fatalf("round %d: enforced hit not charged beside an over-limit shadow hit: %+v", i, v[0])
				}
				if wantAdmit := i == 0; v[1].Admitted != wantAdmit || v[1].Charged != wantAdmit {
					t.Fatalf("round %d: shadow hit %+v, want admitted=charged=%v", i, v[1], wantAdmit)
				}
			}
		})
	}
}

func TestCostExceedingLimitSkipsStore(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	before := c.m.CommandCount()
	v := decide1(t, l, hit(config.SlidingWindowLog, "big", 5, time.Minute, 6))
	if v.Admitted || !v.CostExceedsLimit || v.ResetAfter != time.Minute {
		t.Fatalf("verdict %+v, want denied for cost > limit with a window-long wait", v)
	}
	if n := c.m.CommandCount() - before; n != 0 {
		t.Fatalf("%d store commands for a cost above the limit, want none", n)
	}

	// Beside another hit, the request is checked but nothing is written.
	other := hit(config.SlidingWindowLog, "other", 5, time.Minute, 1)
	vs, err := l.Decide(context.Background(), []Hit{other, hit(config.FixedWindow, "big", 5, time.Minute, 6)})
	if err != nil {
		t.Fatal(err)
	}
	if !vs[0].Admitted || vs[0].Charged || vs[1].Admitted {
		t.Fatalf("verdicts %+v", vs)
	}
	if keys := c.m.Keys(); len(keys) != 0 {
		t.Fatalf("keys written for a denied request: %q", keys)
	}
}

// TestSameKeyHitsAreOneDemand: descriptors of one request that share a
// counter must not each be checked against the state before the others.
func TestSameKeyHitsAreOneDemand(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			h := hit(a, "dup", 3, time.Minute, 1)
			v, err := l.Decide(context.Background(), []Hit{h, h})
			if err != nil {
				t.Fatal(err)
			}
			for i := range v {
				if !v[i].Admitted || !v[i].Charged || v[i].Remaining != 1 {
					t.Fatalf("two hits of 1 on a limit of 3, verdict %d: %+v, want admitted with 1 left", i, v[i])
				}
			}
			v, err = l.Decide(context.Background(), []Hit{h, h})
			if err != nil {
				t.Fatal(err)
			}
			if v[0].Admitted || v[1].Admitted {
				t.Fatalf("two more hits with 1 left: %+v", v)
			}
			if got := decide1(t, l, hit(a, "dup", 3, time.Minute, 0)); got.Remaining != 1 {
				t.Fatalf("remaining %d after a denied pair, want 1", got.Remaining)
			}
		})
	}
}

func TestMergingShadowAndEnforcedKeepsTheEnforcedLimit(t *testing.T) {
	l, _ := newTestLimiter(t, epoch.Add(time.Second))
	enforced := hit(config.FixedWindow, "same", 100, time.Minute, 1)
	shadow := enforced
	shadow.Limit, shadow.Shadow = 2, true
	for i := 0; i < 5; i++ {
		v, err := l.Decide(context.Background(), []Hit{shadow, enforced})
		if err != nil || !v[1].Admitted {
			t.Fatalf("round %d: %+v, %v: a shadow rule's limit of 2 denied the enforced one of 100", i, v, err)
		}
	}
}

// TestRecordIfAlone: a conditional record is recorded past the limit only
// while its counter holds at most a unit more than the fleet's count in
// the same call; taken by others, or without the fleet's count in the call
// (another limit on another Cluster slot), it is decided as a plain hit.
func TestRecordIfAlone(t *testing.T) {
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.SlidingWindowLog} {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			counter := hit(a, "f", 10, time.Minute, 8)
			fleet := counter
			fleet.Key, fleet.Limit = counter.Key+FleetSuffix, 1<<31
			counter.Record, counter.RecordIfAlone = true, true
			fleet.Record, fleet.RecordIfAlone = true, true
			// The fleet alone: 8, then 8 more past the limit of 10.
			for i, want := range []bool{true, false} {
				v, err := l.Decide(context.Background(), []Hit{counter, fleet})
				if err != nil || v[0].Admitted != want || !v[0].Charged {
					t.Fatalf("lease %d alone: %+v %v, want charged, admitted %v", i+1, v, err, want)
				}
			}
			// Without the fleet's count in the call: a plain hit, denied.
			if v := decide1(t, l, counter); v.Admitted || v.Charged {
				t.Fatalf("without the fleet's count: %+v, want denied, not charged", v)
			}
			// Others take from a fresh counter: the lease must fit beside them.
			other := hit(a, "g", 10, time.Minute, 5)
			counter.Key, fleet.Key = other.Key, other.Key+FleetSuffix
			if v := decide1(t, l, other); !v.Admitted {
				t.Fatalf("others' hit: %+v", v)
			}
			v, err := l.Decide(context.Background(), []Hit{counter, fleet})
			if err != nil || v[0].Admitted || v[0].Charged {
				t.Fatalf("lease beside others: %+v %v, want denied, not charged", v, err)
			}
		})
	}
}
