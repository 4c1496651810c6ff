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
			{"reset, then another lease at the same instant", func(t *testing.T, l *Limiter, _ *clock, h Hit, token int64, _ string) {
				// Redis TIME has not moved: the new lease's record must not
				// take the name the reset freed, which the first lease's
				// give-back (a lease on its way at the reset) still names.
				reset1(t, l, h)
				if v := decide1(t, l, h); !v.Charged || v.Token == token {
					t.Fatalf("the second lease: %+v, want charged under another record than %d", v, token)
				}
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

// TestGCRARefundLeavesLiveSlices: a client's refund (is_negative_hits), or
// the give-back of a charge by its token, moves the TAT back only over time
// above every live slice: a slice spends its units up to the TAT its lease
// left, so time taken from under it is charged again while the slice still
// spends it (make sim seed 59971: 25 of burst + limit 24, a refund just
// after a lease). Time above the slices, and above now, goes back.
func TestGCRARefundLeavesLiveSlices(t *testing.T) {
	for _, tc := range []struct {
		name       string
		charged    uint64        // units a client charged at the start
		afterSlice bool          // charged after the slice's lease, not before
		after      time.Duration // then the clock moves this much
		undo       bool          // the charge given back by its token, not a refund
		refund     uint64
		remaining  uint64 // what the bucket of 20 holds after the refund
	}{
		// 10 charged (500 ms of a 50 ms unit), the slice's 5 (250 ms) above
		// them: at 500 ms the client's time has refilled; nothing goes back.
		{name: "a refund of refilled units", charged: 10, after: 500 * time.Millisecond, refund: 10, remaining: 15},
		// At 300 ms, 200 ms of the client's time is still ahead, under the
		// slice's 250 ms: nothing goes back while the slice is live.
		{name: "a refund of units under the slice", charged: 10, after: 300 * time.Millisecond, refund: 10, remaining: 20 - 9},
		{name: "a give-back of a charge under the slice", charged: 10, after: 300 * time.Millisecond, undo: true, remaining: 20 - 9},
		// The client's 500 ms above the slice's 250 ms: at 100 ms, all of it
		// goes back, and the slice's 150 ms still ahead stays.
		{name: "a refund of units above the slice", charged: 10, afterSlice: true, after: 100 * time.Millisecond, refund: 10, remaining: 20 - 3},
		{name: "a give-back of a charge above the slice", charged: 10, afterSlice: true, after: 100 * time.Millisecond, undo: true, remaining: 20 - 3},
		// No client charge: the slice alone is ahead (150 ms of its 250 ms
		// at 100 ms, 3 units), and nothing goes back.
		{name: "only the slice", after: 100 * time.Millisecond, refund: 3, remaining: 20 - 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			h := hit(config.GCRA, "refund-slice", 40, 2*time.Second, tc.charged)
			h.Burst = 20
			var charge Verdict
			if tc.charged > 0 && !tc.afterSlice {
				charge = decide1(t, l, h)
			}
			lease := h
			lease.Cost, lease.Ahead = 5, time.Second
			if v := decide1(t, l, lease); !v.Charged {
				t.Fatalf("the slice's lease: %+v", v)
			}
			if tc.charged > 0 && tc.afterSlice {
				charge = decide1(t, l, h)
			}
			c.add(tc.after)
			if tc.undo {
				giveBack(t, l, Return{Hit: h, Token: charge.Token, Units: tc.charged})
			} else {
				back := h
				back.Cost, back.Refund = tc.refund, true
				decide1(t, l, back)
			}
			check := h
			check.Cost = 0
			if got := decide1(t, l, check).Remaining; got != tc.remaining {
				t.Fatalf("remaining %d after the refund, want %d", got, tc.remaining)
			}
		})
	}
}

// TestLogRefundTakesNoSliceMembers: a log's refund takes the newest members
// a request's own charge added, never a slice's, not even once the slice's
// period is over and its members are the newest up to now: its give-back
// takes those by name, and must find them all.
func TestLogRefundTakesNoSliceMembers(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowLog, "log-refund", 100, time.Minute, 2)
	decide1(t, l, h) // a client's 2 units at 0
	c.add(10 * time.Millisecond)
	lease := h
	lease.Cost, lease.Ahead = 5, time.Second
	v := decide1(t, l, lease)
	if !v.Charged {
		t.Fatalf("the slice's lease: %+v", v)
	}
	c.add(2 * time.Second) // the slice's period is over: its members are behind now
	back := h
	back.Cost, back.Refund = 1, true
	decide1(t, l, back)
	// The slice spent none of its 5: all come back by name.
	if n := giveBack(t, l, Return{Hit: lease, Token: v.Token, Units: 5}); n != 5 {
		t.Fatalf("the slice gave back %d of its 5 unused units, want 5: the refund took its members", n)
	}
	check := h
	check.Cost = 0
	if got := decide1(t, l, check).Remaining; got != 99 {
		t.Fatalf("remaining %d, want 99: the client's 2 less the 1 refunded", got)
	}
}

// TestSlicesOfOneInstantKeepTheirRecords: two slices of one counter
// charged at one Redis TIME (two Envoys' RLQS leases, or a hot key's lease
// beside one, batched into one call; here the store's clock stands still)
// each keep a record of their own: named by that instant alone, the second
// overwrote the first, whose give back then took the second's units while
// the second still spent them.
func TestSlicesOfOneInstantKeepTheirRecords(t *testing.T) {
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch)
			first, second := hit(a, "slices", 100, time.Minute, 5), hit(a, "slices", 100, time.Minute, 7)
			first.Ahead, second.Ahead = time.Second, time.Second
			v1, v2 := decide1(t, l, first), decide1(t, l, second)
			if !v1.Charged || !v2.Charged {
				t.Fatalf("the two leases: %+v, %+v", v1, v2)
			}
			if v1.Token == v2.Token {
				t.Fatalf("both leases have the token %d: one record for two slices", v1.Token)
			}
			// The second first: GCRA's first lies under it, and gives back
			// nothing while it is live (TestGCRARefundLeavesLiveSlices).
			if n := giveBack(t, l, Return{Hit: second, Token: v2.Token, Units: 7}); n != 7 {
				t.Errorf("the second gave back %d, want its 7", n)
			}
			if n := giveBack(t, l, Return{Hit: first, Token: v1.Token, Units: 5}); n != 5 {
				t.Errorf("the first gave back %d, want its 5", n)
			}
		})
	}
}

// TestLogSliceOfOneUnitIsNamed: a log's slice of one unit (an RLQS lease of
// a small share) is named as any slice, "A<score>": named by its bare score
// (the one-member path of a plain hit), its give-back named nothing, a
// Reset deleted it while its holder still spent it, and a client's refund
// could take it once its period was over.
func TestLogSliceOfOneUnitIsNamed(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowLog, "one", 10, time.Minute, 1)
	h.Ahead = 12 * time.Second
	v := decide1(t, l, h)
	if members, _ := c.m.ZMembers(h.Key); len(members) != 1 || members[0] != sliceName(v.Token) {
		t.Fatalf("the log after a slice of one: %q, want [%s]", members, sliceName(v.Token))
	}
	reset1(t, l, h)
	if members, _ := c.m.ZMembers(h.Key); len(members) != 1 {
		t.Fatalf("after a Reset the log holds %q, want the live slice's member", members)
	}
	if n := giveBack(t, l, Return{Hit: h, Token: v.Token, Units: 1}); n != 1 {
		t.Errorf("its give-back gave back %d, want 1", n)
	}
}

// TestReferenceKeysTakeNoSliceRecord: a slice (an RLQS lease) of a counter
// on the reference's keys, which have no hash tag, writes no record beside
// it: on a Cluster that key is on another slot, which the call may not
// touch (e2e TestReferenceKeysOnACluster).
func TestReferenceKeysTakeNoSliceRecord(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := hit(config.ReferenceFixedWindow, "reflease", 100, time.Minute, 5)
	h.Ahead = 12 * time.Second
	if v := decide1(t, l, h); !v.Charged {
		t.Fatalf("the lease: %+v", v)
	}
	if keys := c.m.Keys(); len(keys) != 1 || keys[0] != h.Key {
		t.Errorf("the store holds %q, want only the counter %s", keys, h.Key)
	}
}

// TestLogChargesLeaveBeforeALeaseAhead: a log's charge made while a
// lease's members sit ahead of now (an RLQS lease at its end, 12 s on) is
// scored at now and leaves the window a window later; its score was the
// lease's end + 1 µs before, counted 12 s longer than its window.
func TestLogChargesLeaveBeforeALeaseAhead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cost  uint64
		ahead time.Duration // the charge's own: a slice's period
	}{{"a weighted hit", 2, 0}, {"a slice", 2, time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			lease := hit(config.SlidingWindowLog, "ahead", 6, 10*time.Second, 2)
			lease.Ahead = 12 * time.Second
			decide1(t, l, lease)
			h := hit(config.SlidingWindowLog, "ahead", 6, 10*time.Second, tc.cost)
			h.Ahead = tc.ahead
			if v := decide1(t, l, h); !v.Charged {
				t.Fatalf("the charge beside the lease: %+v", v)
			}
			c.add(11*time.Second + tc.ahead) // the charge has left the window, the lease's members not
			if v := decide1(t, l, hit(config.SlidingWindowLog, "ahead", 6, 10*time.Second, 4)); !v.Admitted {
				t.Fatalf("4 beside the lease's 2 once the charge left: %+v, want admitted", v)
			}
		})
	}
}

// TestCounterRefundLeavesSlicesUnits: a window counter's refund, and the
// give-back of a client's charge, take back only units the store admitted
// itself in the window, never a live slice's (it spends them) nor those a
// slice spent (its requests were admitted): a client charges 3, a slice
// of 5 is leased, and then what each schedule gives back.
func TestCounterRefundLeavesSlicesUnits(t *testing.T) {
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter} {
		for _, tc := range []struct {
			name      string
			back      func(t *testing.T, l *Limiter, h Hit, charge, slice Verdict)
			remaining uint64 // of the limit of 100 after it
		}{
			{"a refund of more than the client's", func(t *testing.T, l *Limiter, h Hit, _, _ Verdict) {
				refundUnits(t, l, h, 10)
			}, 100 - 5},
			{"a give-back of the client's charge after its refund", func(t *testing.T, l *Limiter, h Hit, charge, _ Verdict) {
				refundUnits(t, l, h, 3)
				giveBack(t, l, Return{Hit: h, Token: charge.Token, Units: 3})
			}, 100 - 5},
			{"the slice's unused units given back, then a refund", func(t *testing.T, l *Limiter, h Hit, _, slice Verdict) {
				lease := h
				lease.Cost, lease.Ahead = 5, time.Second
				giveBack(t, l, Return{Hit: lease, Token: slice.Token, Units: 2}) // it spent 3
				refundUnits(t, l, h, 10)
			}, 100 - 3},
		} {
			t.Run(a.String()+"/"+tc.name, func(t *testing.T) {
				l, _ := newTestLimiter(t, epoch)
				h := hit(a, "counter-refund", 100, time.Minute, 3)
				charge := decide1(t, l, h)
				lease := h
				lease.Cost, lease.Ahead = 5, time.Second
				slice := decide1(t, l, lease)
				if !charge.Charged || !slice.Charged {
					t.Fatalf("the charge %+v and the slice's lease %+v, want both charged", charge, slice)
				}
				tc.back(t, l, h, charge, slice)
				check := h
				check.Cost = 0
				if got := decide1(t, l, check).Remaining; got != tc.remaining {
					t.Fatalf("remaining %d, want %d", got, tc.remaining)
				}
			})
		}
	}
}

func refundUnits(t *testing.T, l *Limiter, h Hit, units uint64) {
	t.Helper()
	h.Cost, h.Refund = units, true
	decide1(t, l, h)
}

// TestSliceRecordsStayBounded: a key hot for long leases slice after
// slice, most used up and never given back; the records of windows (for
// GCRA, of TATs) no undo reads again are pruned, so the hash beside the
// counter stays near what its live windows hold.
func TestSliceRecordsStayBounded(t *testing.T) {
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			h := hit(a, "hot", 1000, time.Second, 5)
			h.Ahead = 100 * time.Millisecond
			const leases = 600 // 30 s of 1 s windows, 20 leases in each
			most := 0
			for i := 0; i < leases; i++ {
				if v := decide1(t, l, h); !v.Charged {
					t.Fatalf("lease %d: %+v", i, v)
				}
				fields, _ := c.m.HKeys(h.Key + ":slices")
				most = max(most, len(fields))
				c.add(50 * time.Millisecond)
			}
			// Pruning starts at 64 fields and again at twice what it left:
			// the previous and current windows' 40 records and their units.
			if most > 2*64 {
				t.Fatalf("the records grew to %d fields over %d leases, want at most %d", most, leases, 2*64)
			}
		})
	}
}
