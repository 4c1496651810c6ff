package limiter

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

func gcraHit(key string, limit uint32, window time.Duration, burst uint32, cost uint64) Hit {
	h := hit(config.GCRA, key, limit, window, cost)
	h.Burst = burst
	return h
}

// bucket is an exact GCRA in big integers: times are microseconds times
// the limit, so the emission interval (window / limit) is the whole number
// window. It is what the Lua code must decide, to the microsecond.
type bucket struct {
	limit, window, burst *big.Int // window in microseconds
	tat                  *big.Int // scaled; relative to the trace's start
}

func newBucket(limit uint32, window time.Duration, burst uint32) *bucket {
	return &bucket{big.NewInt(int64(limit)), big.NewInt(window.Microseconds()), big.NewInt(int64(burst)), new(big.Int)}
}

// ceilDiv is a / b rounded up, for b > 0.
func ceilDiv(a, b *big.Int) *big.Int {
	q, m := new(big.Int).DivMod(a, b, new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

func mul(a, b *big.Int) *big.Int { return new(big.Int).Mul(a, b) }

// decide answers a hit of cost at now (microseconds since the start) and
// charges it when it fits. A check (cost 0) asks for one unit, as every
// algorithm's: it is admitted while one unit is in the bucket, and charges
// nothing.
func (b *bucket) decide(now int64, cost uint64) (admit bool, remaining uint64, wait time.Duration) {
	nowS := mul(big.NewInt(now), b.limit)
	if b.tat.Cmp(nowS) < 0 {
		b.tat.Set(nowS)
	}
	owed := new(big.Int).Sub(b.tat, nowS)
	charge := mul(new(big.Int).SetUint64(max(cost, 1)), b.window)
	over := new(big.Int).Add(owed, charge)
	over.Sub(over, mul(b.burst, b.window))
	admit = over.Sign() <= 0
	if admit && cost > 0 {
		b.tat.Add(b.tat, charge)
		owed.Add(owed, charge)
	}
	remaining = new(big.Int).Sub(b.burst, ceilDiv(owed, b.window)).Uint64()
	if admit {
		return true, remaining, time.Duration(ceilDiv(owed, b.limit).Int64()) * time.Microsecond
	}
	return false, remaining, time.Duration(max(1, ceilDiv(over, b.limit).Int64())) * time.Microsecond
}

// TestGCRAMatchesAnExactBucket replays random traffic (costs, gaps, several
// hits in one microsecond) through the Lua code and an exact integer
// bucket: every answer must be the same, admission, remaining and wait to
// the microsecond, also where the interval is no whole number of
// microseconds (1/3 s, 60/7 s) and after hundreds of charges: the TAT is
// kept exactly, and never drifts. The clock runs in 2023 and in 2031.
func TestGCRAMatchesAnExactBucket(t *testing.T) {
	cases := []struct {
		limit  uint32
		window time.Duration
		burst  uint32
		costs  int // costs are 1 to costs
	}{
		{3, time.Second, 3, 1},
		{3, time.Second, 1, 1},
		{10, time.Second, 25, 4},
		{7, time.Minute, 2, 2},
		{6, time.Second, 12, 5},
		{1000, time.Minute, 50, 10},
		{1, time.Hour, 1, 1},
		{4_000_000_000, time.Second, 3_000_000_000, 1_000_000_000},  // T = 1/4000 us
		{999_999_937, 86400 * time.Second, 100_000_000, 30_000_000}, // T = 86.4 us and a remainder
	}
	for _, start := range []time.Time{epoch, time.Date(2031, 5, 17, 3, 4, 5, 678901000, time.UTC)} {
		for _, tc := range cases {
			name := fmt.Sprintf("%d_per_%v_burst_%d/%d", tc.limit, tc.window, tc.burst, start.Year())
			t.Run(name, func(t *testing.T) {
				l, c := newTestLimiter(t, start)
				ref := newBucket(tc.limit, tc.window, tc.burst)
				rng := rand.New(rand.NewPCG(uint64(tc.limit), uint64(tc.burst)))
				// Gaps average a third less than the hits' cost in time:
				// the bucket spends most of the trace near empty.
				meanCost := float64(1+tc.costs) / 2
				gap := max(2, int64(1.4*meanCost*float64(tc.window.Microseconds())/float64(tc.limit)))
				var now int64 // since start, microseconds
				admitted := 0
				for i := range 400 {
					if rng.IntN(4) > 0 { // else: the same microsecond again
						now += rng.Int64N(gap)
					}
					cost := uint64(1 + rng.IntN(tc.costs))
					if rng.IntN(10) == 0 {
						cost = 0
					}
					c.set(start.Add(time.Duration(now) * time.Microsecond))
					v := decide1(t, l, gcraHit("m", tc.limit, tc.window, tc.burst, cost))
					admit, remaining, wait := ref.decide(now, cost)
					if v.Admitted != admit || v.Remaining != remaining || v.ResetAfter != wait {
						t.Fatalf("hit %d (cost %d at +%dus): got admitted %v, remaining %d, wait %v; the exact bucket says %v, %d, %v",
							i, cost, now, v.Admitted, v.Remaining, v.ResetAfter, admit, remaining, wait)
					}
					if admit && cost > 0 {
						admitted++
					}
				}
				if admitted < 40 || admitted > 360 {
					t.Fatalf("%d of 400 charged: the trace does not test both sides of the limit", admitted)
				}
			})
		}
	}
}

// TestGCRABurstThenRate: a full bucket admits its burst at once, then one
// unit per interval, each exactly when the denial said.
func TestGCRABurstThenRate(t *testing.T) {
	l, c := newTestLimiter(t, epoch.Add(time.Second))
	h := gcraHit("b", 10, time.Second, 5, 1) // one unit every 100 ms, 5 at once
	for i := 1; i <= 5; i++ {
		v := decide1(t, l, h)
		if !v.Admitted || v.Remaining != uint64(5-i) || v.ResetAfter != time.Duration(i)*100*time.Millisecond {
			t.Fatalf("burst hit %d: %+v, want admitted, %d left, full again in %dms", i, v, 5-i, 100*i)
		}
	}
	for i := range 20 {
		v := decide1(t, l, h)
		if v.Admitted || v.ResetAfter != 100*time.Millisecond {
			t.Fatalf("round %d: %+v, want denied for exactly 100ms", i, v)
		}
		c.add(v.ResetAfter - time.Microsecond)
		if v := decide1(t, l, h); v.Admitted {
			t.Fatalf("round %d: admitted a microsecond before the announced wait", i)
		}
		c.add(time.Microsecond)
		if v := decide1(t, l, h); !v.Admitted || v.Remaining != 0 {
			t.Fatalf("round %d: at the announced wait %+v, want admitted with 0 left", i, v)
		}
	}
	// Idle for the bucket's whole size in time: full again.
	c.add(500 * time.Millisecond)
	if v := decide1(t, l, gcraHit("b", 10, time.Second, 5, 0)); !v.Admitted || v.Remaining != 5 || v.ResetAfter != 0 {
		t.Fatalf("after 500ms idle: %+v, want a full bucket", v)
	}
}

// TestGCRABurstDefaultsToTheLimit: Burst 0 is a full window's worth.
func TestGCRABurstDefaultsToTheLimit(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	h := gcraHit("d", 4, time.Minute, 0, 1)
	for i := range 4 {
		if v := decide1(t, l, h); !v.Admitted {
			t.Fatalf("hit %d denied: %+v", i, v)
		}
	}
	if v := decide1(t, l, h); v.Admitted || v.ResetAfter != 15*time.Second {
		t.Fatalf("hit 5: %+v, want denied for 15s", v)
	}
}

// TestGCRACosts: a cost takes that many units; one larger than the bucket
// is never admitted and asks nothing of the store; a zero cost checks.
func TestGCRACosts(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	if v := decide1(t, l, gcraHit("c", 10, time.Second, 8, 6)); !v.Admitted || v.Remaining != 2 || v.ResetAfter != 600*time.Millisecond {
		t.Fatalf("cost 6 of 8: %+v", v)
	}
	if v := decide1(t, l, gcraHit("c", 10, time.Second, 8, 3)); v.Admitted || v.Remaining != 2 || v.ResetAfter != 100*time.Millisecond {
		t.Fatalf("cost 3 with 2 left: %+v, want denied for 100ms", v)
	}
	if v := decide1(t, l, gcraHit("c", 10, time.Second, 8, 0)); !v.Admitted || v.Charged || v.Remaining != 2 {
		t.Fatalf("check: %+v", v)
	}
	before := c.m.CommandCount()
	if v := decide1(t, l, gcraHit("c", 10, time.Second, 8, 9)); v.Admitted || !v.CostExceedsLimit {
		t.Fatalf("cost 9 in a bucket of 8: %+v", v)
	}
	if n := c.m.CommandCount() - before; n != 0 {
		t.Fatalf("%d store commands for a cost above the bucket", n)
	}
	// A burst above the limit lets a cost above the limit through.
	if v := decide1(t, l, gcraHit("big", 10, time.Second, 30, 25)); !v.Admitted || v.Remaining != 5 {
		t.Fatalf("cost 25 in a bucket of 30 at 10/s: %+v", v)
	}
}

// TestGCRAWithoutARate: a limit of 0 (an override may send one) admits
// nothing, not even a check: no unit is ever in the bucket.
func TestGCRAWithoutARate(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	if v := decide1(t, l, gcraHit("z", 0, time.Minute, 0, 0)); v.Admitted || v.Remaining != 0 {
		t.Fatalf("a check at limit 0: %+v, want denied with nothing remaining", v)
	}
	if v := decide1(t, l, gcraHit("z", 0, time.Minute, 0, 1)); v.Admitted || !v.CostExceedsLimit {
		t.Fatalf("a hit at limit 0: %+v, want denied, the cost above the bucket", v)
	}
	if keys := c.m.Keys(); len(keys) != 0 {
		t.Fatalf("keys %q written at limit 0", keys)
	}
}

// TestGCRAKeepsOneNumber: whatever the traffic, the state is one string
// holding one instant, expiring when the bucket is full again.
func TestGCRAKeepsOneNumber(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	h := gcraHit("one", 1000, time.Second, 100, 1)
	for range 300 {
		decide1(t, l, h)
		c.add(300 * time.Microsecond)
	}
	keys := c.m.Keys()
	if len(keys) != 1 || keys[0] != h.Key {
		t.Fatalf("keys %q, want only %q", keys, h.Key)
	}
	v, err := c.m.Get(h.Key)
	if err != nil {
		t.Fatal(err)
	}
	// The TAT: Unix microseconds and a remainder in 1/limit microseconds.
	us, rem, ok := strings.Cut(v, ":")
	if at, err := strconv.ParseInt(us, 10, 64); !ok || err != nil || at < c.now.UnixMicro() {
		t.Fatalf("stored %q, want the TAT, <microseconds>:<remainder>, not before now", v)
	}
	if r, err := strconv.ParseUint(rem, 10, 32); err != nil || r >= 1000 {
		t.Fatalf("stored %q: remainder not below the limit", v)
	}
	probe := decide1(t, l, gcraHit("one", 1000, time.Second, 100, 0))
	ttl := c.m.TTL(h.Key)
	if full := probe.ResetAfter; ttl < full || ttl > full+time.Millisecond {
		t.Fatalf("TTL %v, want the time until the bucket is full, %v, in whole ms", ttl, full)
	}
	c.m.FastForward(ttl)
	if keys := c.m.Keys(); len(keys) != 0 {
		t.Fatalf("keys %q left once the bucket is full", keys)
	}
}

// TestGCRARefund: a refund across slots gives back exactly the charge, and
// never makes the bucket fuller than full.
func TestGCRARefund(t *testing.T) {
	s := newShards(t, 2, epoch.Add(time.Second), nil)
	free := hitOn("free", 0, 2, config.GCRA, 10, 3)
	free.Burst = 10
	decide1(t, s.l, free) // 7 left
	full := hitOn("full", 1, 2, config.GCRA, 1, 1)
	decide1(t, s.l, full)

	v, err := s.l.Decide(context.Background(), []Hit{free, full})
	if err != nil {
		t.Fatal(err)
	}
	if !v[0].Admitted || v[0].Charged || v[0].Remaining != 7 || v[1].Admitted {
		t.Fatalf("verdicts %+v: want the free hit admitted but refunded (7 left), the full one denied", v)
	}
	s.l.refunds.Wait()
	if got := s.remaining(t, free); got != 7 {
		t.Fatalf("%d left after the refund, want 7", got)
	}

	// Run the refund script by hand, after the bucket refilled: it gives
	// back what is owed, not more.
	client := s.l.router.(splitRouter).servers[0]
	for _, m := range s.servers {
		m.SetTime(epoch.Add(13 * time.Second)) // 2 of the 3 owed units (6 s each) back
	}
	n, err := refundScript.Run(context.Background(), client, []string{free.Key}, describeT(t, config.GCRA).ID, 0, 3, 10, 60).Int()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("refund of 3 units with 1 owed gave back %d", n)
	}
	if got := s.remaining(t, free); got != 10 {
		t.Fatalf("%d left after refunding more than owed, want a full bucket of 10", got)
	}
	if keys := s.servers[0].Keys(); len(keys) != 0 {
		t.Fatalf("keys %q left for a full bucket", keys)
	}
}

// TestGCRADebtOnASlowRateKeepsTheStoreWorking: a recorded cost (Envoy's
// stream-done hits_addend, which a client controls) on a slow GCRA rule
// would move the TAT so far that its expiry overflows Redis's SET PX, and
// the whole decide call, every request batched with it, would fail. The
// debt stops at 100 years ahead, which denies as long as anyone waits.
func TestGCRADebtOnASlowRateKeepsTheStoreWorking(t *testing.T) {
	l, _ := newTestLimiter(t, epoch.Add(10*time.Second))
	window := 30 * 24 * time.Hour // one unit per 30 days: T ~ 2.6e12 us
	h := hit(config.GCRA, "slow", 1, window, 1<<32)
	h.Record = true
	vs, err := l.Decide(context.Background(), []Hit{h, hit(config.GCRA, "other", 1, window, 1)})
	if err != nil {
		t.Fatalf("a recorded cost of 2^32 on 1 per 30 days: %v (%+v), want a recorded debt", err, vs)
	}
	if vs[0].Admitted || !vs[0].Charged || vs[0].FailureVerdict || !vs[1].Admitted || vs[1].FailureVerdict {
		t.Fatalf("verdicts %+v, want the report denied and charged, the other hit decided", vs)
	}
	if wait := vs[0].ResetAfter; wait < 99*365*24*time.Hour || wait > config.MaxWindow {
		t.Fatalf("wait %v after the debt, want about 100 years", wait)
	}
	if v := decide1(t, l, hit(config.GCRA, "slow", 1, window, 0)); v.Admitted || v.FailureVerdict {
		t.Fatalf("a check after the debt: %+v, want denied", v)
	}
}
