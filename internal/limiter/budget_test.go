package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

func recorded(a config.Algorithm, key string, limit uint32, window time.Duration, cost uint64) Hit {
	h := hit(a, key, limit, window, cost)
	h.Record = true
	return h
}

func refund(a config.Algorithm, key string, limit uint32, window time.Duration, units uint64) Hit {
	h := hit(a, key, limit, window, units)
	h.Refund = true
	return h
}

// TestCheckIsDeniedWhenNothingRemains: a zero-cost check asks for one unit.
func TestCheckIsDeniedWhenNothingRemains(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(time.Second))
			decide1(t, l, hit(a, "z", 3, time.Minute, 3))
			c.add(time.Second)
			v := decide1(t, l, hit(a, "z", 3, time.Minute, 0))
			if v.Admitted || v.Charged || v.Remaining != 0 || v.ResetAfter <= 0 || v.ResetAfter > 2*time.Minute {
				t.Fatalf("check of a full counter: %+v, want denied with a wait within two windows", v)
			}
			// Admitted exactly when the announced wait has passed.
			c.add(v.ResetAfter - time.Millisecond)
			if v := decide1(t, l, hit(a, "z", 3, time.Minute, 0)); v.Admitted {
				t.Fatalf("check a millisecond before the announced wait: %+v, want denied", v)
			}
			c.add(time.Millisecond)
			if v := decide1(t, l, hit(a, "z", 3, time.Minute, 0)); !v.Admitted || v.Charged {
				t.Fatalf("check at the announced wait: %+v, want admitted, not charged", v)
			}
		})
	}
}

// TestRecordedCostsOverdrawTheBudget is the two-phase token pattern: a check
// (cost 0) before the request, the tokens used reported after it. A report
// past the budget is recorded, and denies checks until the window has slid
// past it; the wait announced is exact.
func TestRecordedCostsOverdrawTheBudget(t *testing.T) {
	const budget = 1000
	for _, a := range algorithms {
		for _, tc := range []struct {
			name    string
			reports []uint64
		}{
			{"one report of 1200", []uint64{1200}},
			{"three reports of 400", []uint64{400, 400, 400}},
		} {
			t.Run(a.String()+"/"+tc.name, func(t *testing.T) {
				l, c := newTestLimiter(t, epoch.Add(10*time.Second))
				check := hit(a, "tokens", budget, time.Hour, 0)
				var total uint64
				for i, cost := range tc.reports {
					if v := decide1(t, l, check); !v.Admitted {
						t.Fatalf("check before report %d (%d used): %+v, want admitted", i+1, total, v)
					}
					c.add(time.Second)
					total += cost
					v := decide1(t, l, recorded(a, "tokens", budget, time.Hour, cost))
					if !v.Charged || v.Admitted != (total <= budget) {
						t.Fatalf("report %d of %d (%d in all): %+v, want charged, admitted %v", i+1, cost, total, v, total <= budget)
					}
					c.add(time.Second)
				}
				v := decide1(t, l, check)
				if v.Admitted || v.Remaining != 0 {
					t.Fatalf("check after %d reported: %+v, want denied, nothing remaining", total, v)
				}
				if v.ResetAfter <= 0 || v.ResetAfter > 2*time.Hour {
					t.Fatalf("check after %d reported: wait %v, want within two windows", total, v.ResetAfter)
				}
				// The debt holds until the announced wait, then the budget is usable.
				c.add(v.ResetAfter - time.Millisecond)
				if v := decide1(t, l, check); v.Admitted {
					t.Fatalf("check a millisecond before the announced wait: %+v, want denied", v)
				}
				c.add(time.Millisecond)
				if v := decide1(t, l, check); !v.Admitted {
					t.Fatalf("check at the announced wait: %+v, want admitted", v)
				}
			})
		}
	}
}

// TestDebtWaits: each algorithm keeps a debt as long as its window keeps the
// units: the log one window after the report, the fixed window to its end,
// the counter as its weighted estimate falls back under the limit.
func TestDebtWaits(t *testing.T) {
	const budget = 1000
	want := map[config.Algorithm]time.Duration{
		config.SlidingWindowLog: time.Hour,
		config.FixedWindow:      time.Hour - 10*time.Minute,
		// 1200 counted in this window weighs 1200 * (1 - e/hour) in the
		// next one; one unit fits once that is at most 999: e >= 0.1675 h.
		config.SlidingWindowCounter: 50*time.Minute + 603*time.Second,
		// The TAT moves 1200 units of 3.6 s past now; one unit fits once
		// the bucket owes at most 999 units: 201 units later.
		config.GCRA: 201 * 3600 * time.Millisecond,
	}
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(10*time.Minute))
			v := decide1(t, l, recorded(a, "d", budget, time.Hour, 1200))
			if v.Admitted || !v.Charged || v.ResetAfter != want[a] {
				t.Fatalf("report of 1200 on %d: %+v, want denied, charged, wait %v", budget, v, want[a])
			}
		})
	}
}

// TestUnrecordedCostsKeepTheRule: a cost not reported after the fact is
// charged only when it fits, and one above the limit never reaches the store.
func TestUnrecordedCostsKeepTheRule(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(time.Second))
			decide1(t, l, hit(a, "u", 1000, time.Hour, 800))
			if v := decide1(t, l, hit(a, "u", 1000, time.Hour, 400)); v.Admitted || v.Charged {
				t.Fatalf("400 on 800 of 1000: %+v, want denied, not charged", v)
			}
			if v := decide1(t, l, hit(a, "u", 1000, time.Hour, 200)); !v.Admitted || !v.Charged || v.Remaining != 0 {
				t.Fatalf("200 on 800 of 1000: %+v, want admitted and charged (the 400 cost nothing)", v)
			}
			before := c.m.CommandCount()
			if v := decide1(t, l, hit(a, "u", 1000, time.Hour, 1200)); !v.CostExceedsLimit {
				t.Fatalf("1200 on 1000: %+v, want denied without the store", v)
			}
			if n := c.m.CommandCount() - before; n != 0 {
				t.Fatalf("%d store commands for an unrecorded cost above the limit", n)
			}
		})
	}
}

// TestRecordedCostAndAllOrNothing: a recorded cost is charged whatever the
// request's other hits say; past its limit it denies the request, whose
// other hits are then not charged.
func TestRecordedCostAndAllOrNothing(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			decide1(t, l, hit(a, "full", 1, time.Minute, 1))
			vs, err := l.Decide(context.Background(), []Hit{recorded(a, "r", 10, time.Minute, 4), hit(a, "full", 1, time.Minute, 1)})
			if err != nil {
				t.Fatal(err)
			}
			if !vs[0].Admitted || !vs[0].Charged || vs[0].Remaining != 6 || vs[1].Admitted {
				t.Fatalf("report beside a denied hit: %+v, want the report admitted and charged (6 left)", vs)
			}
			vs, err = l.Decide(context.Background(), []Hit{recorded(a, "r", 10, time.Minute, 9), hit(a, "free", 5, time.Minute, 1)})
			if err != nil {
				t.Fatal(err)
			}
			if vs[0].Admitted || !vs[0].Charged || !vs[1].Admitted || vs[1].Charged {
				t.Fatalf("report past its limit beside a free hit: %+v, want the report denied and charged, the free hit not charged", vs)
			}
			if v := decide1(t, l, hit(a, "free", 5, time.Minute, 5)); !v.Admitted {
				t.Fatalf("free counter after the denied request: %+v, want all 5 left", v)
			}
		})
	}
}

// TestRefundGivesUnitsBack: a refund frees what it says, never below zero,
// and never gives another window's units to this one.
func TestRefundGivesUnitsBack(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(10*time.Second))
			decide1(t, l, hit(a, "r", 5, time.Minute, 5))
			c.add(time.Second)
			v := decide1(t, l, refund(a, "r", 5, time.Minute, 2))
			if !v.Admitted || v.Charged || v.Remaining != 2 {
				t.Fatalf("refund of 2 on a full 5: %+v, want admitted, 2 remaining", v)
			}
			if v := decide1(t, l, hit(a, "r", 5, time.Minute, 2)); !v.Admitted || v.Remaining != 0 {
				t.Fatalf("cost 2 after the refund: %+v, want admitted, 0 remaining", v)
			}
			if v := decide1(t, l, hit(a, "r", 5, time.Minute, 0)); v.Admitted {
				t.Fatalf("check after the refund was used: %+v, want denied", v)
			}
			// A refund of nothing is no check: admitted, however full.
			if v := decide1(t, l, refund(a, "r", 5, time.Minute, 0)); !v.Admitted || v.Remaining != 0 {
				t.Fatalf("refund of 0 on a full counter: %+v, want admitted, 0 remaining", v)
			}
			if v := decide1(t, l, refund(a, "r", 5, time.Minute, 100)); !v.Admitted || v.Remaining != 5 {
				t.Fatalf("refund of 100 on 5 used: %+v, want 5 remaining (never below zero)", v)
			}
			if v := decide1(t, l, hit(a, "r", 5, time.Minute, 5)); !v.Admitted {
				t.Fatalf("cost 5 after refunding everything: %+v", v)
			}
			if v := decide1(t, l, hit(a, "r", 5, time.Minute, 1)); v.Admitted {
				t.Fatalf("a sixth unit: %+v, want denied: the refund of 100 gave back 5, no more", v)
			}
		})
	}
}

// TestRefundOfChargesAtOneInstant: a refund gives back units charged at the
// Redis TIME it runs at, one by one: the log names them by scores a
// microsecond apart from that time on, ahead of it (a burst in one call,
// or calls in one microsecond), and took only the first before.
func TestRefundOfChargesAtOneInstant(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(10*time.Second))
			for range 4 {
				decide1(t, l, hit(a, "i", 5, time.Minute, 1))
			}
			if v := decide1(t, l, refund(a, "i", 5, time.Minute, 3)); !v.Admitted || v.Remaining != 4 {
				t.Fatalf("refund of 3 of 4 charged at this instant: %+v, want 4 remaining", v)
			}
			if v := decide1(t, l, hit(a, "i", 5, time.Minute, 4)); !v.Admitted {
				t.Fatalf("4 after the refund: %+v, want admitted", v)
			}
		})
	}
}

// TestRefundNeverCrossesWindows: units charged in one window are not given
// back to the next: the next window's capacity never exceeds the limit.
func TestRefundNeverCrossesWindows(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, c := newTestLimiter(t, epoch.Add(-time.Second))
			decide1(t, l, hit(a, "w", 4, time.Minute, 4))
			c.set(epoch.Add(2 * time.Minute)) // the charge's window is gone for every algorithm
			decide1(t, l, hit(a, "w", 4, time.Minute, 1))
			v := decide1(t, l, refund(a, "w", 4, time.Minute, 4))
			if !v.Admitted || v.Remaining != 4 {
				t.Fatalf("refund of 4 with 1 used in this window: %+v, want 4 remaining", v)
			}
			if v := decide1(t, l, hit(a, "w", 4, time.Minute, 4)); !v.Admitted {
				t.Fatalf("4 after the refund: %+v", v)
			}
			if v := decide1(t, l, hit(a, "w", 4, time.Minute, 1)); v.Admitted {
				t.Fatalf("a fifth unit in the window: %+v, want denied", v)
			}
		})
	}
}

// TestRefundDropsTheCachedDenial: a denial kept by the deny cache is
// forgotten when a refund gives its counter units back, and Record hits are
// never answered from it.
func TestRefundDropsTheCachedDenial(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			m, _ := luastore.RunT(t)
			client := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { client.Close() })
			m.SetTime(epoch.Add(time.Second))
			l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: time.Minute})
			t.Cleanup(l.Close)

			decide1(t, l, hit(a, "c", 3, time.Hour, 3))
			check := hit(a, "c", 3, time.Hour, 0)
			if v := decide1(t, l, check); v.Admitted {
				t.Fatalf("check of a full counter: %+v", v)
			}
			before := m.CommandCount()
			if v := decide1(t, l, check); v.Admitted || m.CommandCount() != before {
				t.Fatalf("second check: %+v, %d store commands; want denied from the cache", v, m.CommandCount()-before)
			}
			decide1(t, l, refund(a, "c", 3, time.Hour, 1))
			if v := decide1(t, l, check); !v.Admitted {
				t.Fatalf("check after a refund of 1: %+v, want admitted (the cached denial dropped)", v)
			}

			// A report is recorded even when the same cost was just denied.
			rec := recorded(a, "c", 3, time.Hour, 2)
			for i := range 2 {
				if v := decide1(t, l, rec); v.Admitted || !v.Charged {
					t.Fatalf("report %d of 2 on 1 remaining: %+v, want charged past the limit", i+1, v)
				}
			}
		})
	}
}

// TestLogRecordsAtMostTheLimitPerCharge: a huge report on the log costs at
// most limit members, and still blocks the window.
func TestLogRecordsAtMostTheLimitPerCharge(t *testing.T) {
	l, c := newTestLimiter(t, epoch.Add(time.Second))
	h := recorded(config.SlidingWindowLog, "big", 100, time.Minute, 1<<62)
	if v := decide1(t, l, h); v.Admitted || !v.Charged || v.ResetAfter != time.Minute {
		t.Fatalf("report of 2^62 on 100: %+v, want charged, denied for a minute", v)
	}
	if n, err := c.m.ZMembers(h.Key); err != nil || len(n) != 100 {
		t.Fatalf("log members: %d (%v), want 100", len(n), err)
	}
	for _, cost := range []uint64{1 << 62, 1} {
		v := decide1(t, l, recorded(config.SlidingWindowCounter, "big", 100, time.Minute, cost))
		if v.Admitted || !v.Charged {
			t.Fatalf("counter report of %d: %+v", cost, v)
		}
	}
}

// TestRefundIsNeverDeniedByFailureMode: with the store down, a refund is
// answered admitted even under failure_mode deny: it never denies.
func TestRefundIsNeverDeniedByFailureMode(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	c.m.Close()
	h := refund(config.FixedWindow, "f", 5, time.Minute, 1)
	h.FailureMode = config.FailureDeny
	v, err := l.Decide(context.Background(), []Hit{h})
	if err == nil || !v[0].Admitted || !v[0].FailureVerdict {
		t.Fatalf("refund with the store down: %+v, %v; want an admitted failure verdict and an error", v, err)
	}
}

// TestAcrossSlotsRecordedCostsStay: across cluster slots, the charges a
// denied request made elsewhere are refunded, but never a recorded cost.
func TestAcrossSlotsRecordedCostsStay(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newShards(t, 2, epoch.Add(time.Second), nil)
			full := hitOn("full", 1, 2, a, 1, 1)
			decide1(t, s.l, full)
			report := hitOn("report", 0, 2, a, 10, 4)
			report.Record = true
			v, err := s.l.Decide(context.Background(), []Hit{report, full})
			if err != nil {
				t.Fatal(err)
			}
			if !v[0].Charged || v[1].Admitted {
				t.Fatalf("verdicts %+v: want the report charged, the full hit denied", v)
			}
			// A report past its limit denies; the other slot's charge is undone.
			over := hitOn("over", 1, 2, a, 3, 5)
			over.Record = true
			free := hitOn("free", 0, 2, a, 10, 2)
			v, err = s.l.Decide(context.Background(), []Hit{free, over})
			if err != nil {
				t.Fatal(err)
			}
			if v[0].Charged || v[1].Admitted || !v[1].Charged {
				t.Fatalf("verdicts %+v: want the free hit refunded, the report denied and charged", v)
			}
			s.l.refunds.Wait()
			if got := s.remaining(t, report); got != 6 {
				t.Fatalf("report counter has %d left, want 6: a recorded cost is never refunded", got)
			}
			if got := s.remaining(t, free); got != 10 {
				t.Fatalf("free counter has %d left after the refund, want 10", got)
			}
			if got := s.remaining(t, over); got != 0 {
				t.Fatalf("overdrawn counter has %d left, want 0", got)
			}
		})
	}
}

// TestRefundAndChargeOfOneKeyInOneRequest: a request that gives units back
// to a counter (is_negative_hits) and takes some from it (a refund and a
// charge are not one demand, so both reach decide.lua) leaves it at used -
// refund + charge, whichever comes first among its hits: the refund applies
// before the charge is checked, and the charge's write starts from it.
func TestRefundAndChargeOfOneKeyInOneRequest(t *testing.T) {
	for _, a := range algorithms {
		for _, refundFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/refund first %t", a, refundFirst), func(t *testing.T) {
				l, c := newTestLimiter(t, epoch.Add(10*time.Second))
				decide1(t, l, hit(a, "rc", 5, time.Minute, 3)) // 3 of 5 used
				c.add(time.Second)
				req := []Hit{refund(a, "rc", 5, time.Minute, 2), hit(a, "rc", 5, time.Minute, 1)} // 1, then 2 used
				if !refundFirst {
					req[0], req[1] = req[1], req[0]
				}
				vs, err := l.Decide(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if !vs[0].Admitted || !vs[1].Admitted || vs[0].Charged == vs[1].Charged {
					t.Fatalf("refund of 2 and charge of 1 on 3 of 5 used: %+v, want both admitted, the charge charged", vs)
				}
				if v := decide1(t, l, hit(a, "rc", 5, time.Minute, 3)); !v.Admitted || v.Remaining != 0 {
					t.Fatalf("3 after (3 - 2 + 1) of 5 used: %+v, want admitted with 0 left (the refund was lost)", v)
				}
				if v := decide1(t, l, hit(a, "rc", 5, time.Minute, 1)); v.Admitted {
					t.Fatalf("1 more on a full counter: %+v, want denied", v)
				}
			})
		}
	}
}

// TestRefundAndChargeInOneCallThenALaterRequest: in one decide call, a
// request refunding and charging one key, then a later request of the call
// on that key, which sees the state both left (decide.lua keeps it in seen
// and in its pending writes, not in Redis).
func TestRefundAndChargeInOneCallThenALaterRequest(t *testing.T) {
	for _, a := range algorithms {
		for _, refundFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/refund first %t", a, refundFirst), func(t *testing.T) {
				m, _ := luastore.RunT(t)
				m.SetTime(epoch.Add(10 * time.Second))
				client := redis.NewClient(&redis.Options{Addr: m.Addr()})
				defer client.Close()
				charge := func(n uint64) Hit { return hit(a, "rc", 5, time.Minute, n) }
				back := refund(a, "rc", 5, time.Minute, 2)
				mixed := []Hit{back, charge(1)}
				if !refundFirst {
					mixed[0], mixed[1] = mixed[1], mixed[0]
				}
				got := decideCall(t, client,
					request{hits: []Hit{charge(3)}, charge: true}, // 3 used
					request{hits: mixed, charge: true},            // 3 - 2 + 1
					request{hits: []Hit{charge(3)}, charge: true}, // 5 used
					request{hits: []Hit{charge(1)}, charge: true}, // full
				)
				// state: 0 denied, 1 admitted (a refund), 2 charged.
				want := [][2]int64{{2, 2}, {1, -1}, {2, 3}, {2, 0}, {0, 0}}
				if !refundFirst {
					want[1], want[2] = want[2], want[1]
				}
				for i, w := range want {
					if got[i][0] != w[0] || w[1] >= 0 && got[i][1] != w[1] {
						t.Fatalf("hit %d: state %d, %d left; want %v (all: %v)", i, got[i][0], got[i][1], w, got)
					}
				}
				// The call's writes landed as the last request saw them.
				l := New(client, &Options{DenyCache: -1})
				defer l.Close()
				if v := decide1(t, l, charge(0)); v.Admitted {
					t.Fatalf("a check after the call: %+v, want denied (5 of 5 used)", v)
				}
			})
		}
	}
}

// TestBudgetsOnALimitOfZero: a recorded cost on a log whose limit is 0 (a
// limit override of 0) adds no member, which would count as a unit the day
// the limit is raised; a GCRA refund with a limit of 0 leaves the bucket as
// it was (its refill time would divide by zero).
func TestBudgetsOnALimitOfZero(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch.Add(time.Second))
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	l := New(client, &Options{DenyCache: -1})
	defer l.Close()

	report := recorded(config.SlidingWindowLog, "zero", 0, time.Minute, 3)
	if v := decide1(t, l, report); v.Admitted {
		t.Fatalf("a report on a limit of 0: %+v, want denied", v)
	}
	if n := client.ZCard(context.Background(), report.Key).Val(); n != 0 {
		t.Fatalf("log of a limit of 0 holds %d members, want none", n)
	}

	charge := hit(config.GCRA, "bucket", 5, time.Minute, 2)
	decide1(t, l, charge)
	before := client.Get(context.Background(), charge.Key).Val()
	if v := decide1(t, l, refund(config.GCRA, "bucket", 0, time.Minute, 1)); !v.Admitted || v.FailureVerdict {
		t.Fatalf("a refund with a limit of 0: %+v, want admitted", v)
	}
	if after := client.Get(context.Background(), charge.Key).Val(); after != before {
		t.Fatalf("bucket %q after a refund with a limit of 0, want %q unchanged", after, before)
	}
}
