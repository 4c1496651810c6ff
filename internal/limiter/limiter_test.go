package limiter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
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
	m := miniredis.RunT(t)
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

func TestScriptFlushIsTransparent(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	h := hit(config.SlidingWindowCounter, "flush", 100, time.Minute, 1)
	for i := 0; i < 5; i++ {
		if i == 2 {
			if err := l.router.(singleRouter).client.(*redis.Client).ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		decide1(t, l, h)
	}
	if v := decide1(t, l, hit(config.SlidingWindowCounter, "flush", 100, time.Minute, 0)); v.Remaining != 95 {
		t.Fatalf("remaining %d, want 95", v.Remaining)
	}
}

func TestStoreDownAnswersByFailureMode(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	c.m.Close()
	allow := hit(config.FixedWindow, "allow", 5, time.Minute, 1)
	deny := hit(config.FixedWindow, "deny", 5, time.Minute, 1)
	deny.FailureMode = config.FailureDeny
	tooBig := hit(config.FixedWindow, "big", 5, time.Minute, 6) // allow, yet never admissible
	start := time.Now()
	v, err := l.Decide(context.Background(), []Hit{allow, deny, tooBig})
	if !errors.Is(err, ErrStore) || ErrorKind(err) != "connection" {
		t.Fatalf("error %v (kind %q), want ErrStore of kind connection", err, ErrorKind(err))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	want := []Verdict{
		{FailureVerdict: true, Admitted: true, Remaining: 5},
		{FailureVerdict: true, ResetAfter: FailureRetry},
		{CostExceedsLimit: true, ResetAfter: time.Minute},
	}
	for i := range want {
		if v[i] != want[i] {
			t.Errorf("verdict %d: %+v, want %+v", i, v[i], want[i])
		}
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

// TestNoRetryAfterALostReply: the script is not idempotent, so a reply lost
// with its connection must not make the client run it again.
func TestNoRetryAfterALostReply(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(epoch)
	// The proxy relays both ways until a script call passes: it forwards
	// that one, then drops the connection instead of relaying the reply.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", m.Addr())
			if err != nil {
				_ = conn.Close() // the client sees its connection end
				return
			}
			var scriptSent atomic.Bool
			go func() {
				defer conn.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := upstream.Read(buf)
					if err != nil || scriptSent.Load() {
						return
					}
					if _, err := conn.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			go func() {
				defer upstream.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := conn.Read(buf)
					if err != nil {
						return
					}
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("eval")) {
						scriptSent.Store(true)
					}
					if _, err := upstream.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	directClient := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer directClient.Close()
	direct := New(directClient, nil)
	defer direct.Close()
	// Loaded, so that the proxied EVALSHA runs rather than meeting NOSCRIPT.
	if err := decideScript.Load(context.Background(), directClient).Err(); err != nil {
		t.Fatal(err)
	}
	store, err := OpenStore(StoreConfig{URL: "redis://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	l := New(store.Client, &Options{Timeout: 5 * time.Second})
	defer l.Close()
	h := hit(config.FixedWindow, "once", 10, time.Minute, 1)
	if _, err := l.Decide(context.Background(), []Hit{h}); !errors.Is(err, ErrStore) {
		t.Fatalf("error %v, want ErrStore for a lost reply", err)
	}
	got, err := direct.Decide(context.Background(), []Hit{hit(config.FixedWindow, "once", 10, time.Minute, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Remaining != 9 {
		t.Fatalf("remaining %d: the request was charged %d times, want once", got[0].Remaining, 10-got[0].Remaining)
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

func TestStoreDeadline(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: stalledServer(t), ContextTimeoutEnabled: true})
	defer client.Close()
	l := New(client, &Options{Timeout: 50 * time.Millisecond})
	defer l.Close()
	start := time.Now()
	_, err := l.Decide(context.Background(), []Hit{hit(config.FixedWindow, "x", 5, time.Minute, 1)})
	if !errors.Is(err, ErrStore) || ErrorKind(err) != "timeout" {
		t.Fatalf("error %v (kind %q), want ErrStore of kind timeout", err, ErrorKind(err))
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("stalled store answered after %v, want about the 50ms deadline", d)
	}
}

func TestRedisErrorsAreObservedWithTheirKind(t *testing.T) {
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	var observed []error
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1, Observe: func(_ time.Duration, err error) { observed = append(observed, err) }})
	defer l.Close()
	h := hit(config.SlidingWindowLog, "typed", 5, time.Minute, 1)
	decide1(t, l, h)
	m.Del(h.Key)
	if err := m.Set(h.Key, "a string where the log keeps a sorted set"); err != nil {
		t.Fatal(err)
	}
	_, err := l.Decide(context.Background(), []Hit{h})
	if !errors.Is(err, ErrStore) || ErrorKind(err) != "redis" {
		t.Fatalf("error %v (kind %q), want ErrStore of kind redis", err, ErrorKind(err))
	}
	if len(observed) != 2 || observed[0] != nil || observed[1] == nil {
		t.Fatalf("observed %v, want a success then the failure", observed)
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

// TestErrorKindOfNoErrorAllocatesNothing: it runs for every store call.
func TestErrorKindOfNoErrorAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { ErrorKind(nil) }); n != 0 {
		t.Fatalf("ErrorKind(nil) allocates %v times", n)
	}
}

func TestErrorKindOfACancelledCall(t *testing.T) {
	if k := ErrorKind(fmt.Errorf("%w: %w", ErrStore, context.Canceled)); k != "canceled" {
		t.Fatalf("kind %q, want canceled", k)
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

// stalledServer returns the address of a listener that accepts connections
// and never answers: a stalled Redis.
func stalledServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	return ln.Addr().String()
}

// TestQuotaHits: a request with quota hits is charged only when every
// ordinary hit fits and at least one quota does; a quota hit that does not
// fit is not charged, and denies nothing on its own.
func TestQuotaHits(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			quota := func(key string, group uint32, limit uint32, cost uint64) Hit {
				h := hit(a, key, limit, time.Minute, cost)
				h.Quota, h.QuotaGroup = true, group
				return h
			}
			ordinary := hit(a, "ordinary", 10, time.Minute, 1)
			full, free := quota("full", 0, 1, 1), quota("free", 1, 10, 1)
			decide1(t, l, full)
			decide(t, l, []Hit{ordinary, full, free}, []bool{true, false, true})       // one quota fits
			decide(t, l, []Hit{ordinary, full}, []bool{false, false})                  // every quota over
			decide(t, l, []Hit{ordinary, quota("big", 2, 1, 2)}, []bool{false, false}) // over without a store call
			spent := hit(a, "spent", 1, time.Minute, 1)
			decide1(t, l, spent)
			decide(t, l, []Hit{spent, free}, []bool{false, false}) // an ordinary hit over
			if got := remainingOf(t, l, ordinary); got != 9 {
				t.Fatalf("ordinary counter has %d left, want 9: only the first request charged it", got)
			}
			if got := remainingOf(t, l, free); got != 9 {
				t.Fatalf("free quota has %d left, want 9", got)
			}
		})
	}
}

// quotaCase is a request for TestQuotaGroups and its twins across slots
// and stores: its hits, then what each is answered and charged. Every
// counter admits 2 a minute.
type quotaCase struct {
	name              string
	hits              []quotaCaseHit
	admitted, charged []bool
}

// quotaCaseHit is a hit of a quotaCase, on the counter named key.
type quotaCaseHit struct {
	key   string
	group int    // its quota; -1 for an ordinary hit
	full  bool   // its counter is spent beforehand
	cost  uint64 // 0 means 1
}

// quotaCases are the quota hits of one group (a descriptor's limits) as
// one quota, on counters of their own; sharedQuotaCases share a counter.
var quotaCases = []quotaCase{
	{"one limit over, another quota fits",
		[]quotaCaseHit{{"o", -1, false, 0}, {"a1", 0, true, 0}, {"a2", 0, false, 0}, {"b", 1, false, 0}},
		[]bool{true, false, true, true}, []bool{true, false, false, true}},
	{"every quota over",
		[]quotaCaseHit{{"o", -1, false, 0}, {"a1", 0, true, 0}, {"a2", 0, false, 0}, {"b", 1, true, 0}},
		[]bool{true, false, true, false}, []bool{false, false, false, false}},
	{"the only quota, one limit over",
		[]quotaCaseHit{{"a1", 0, true, 0}, {"a2", 0, false, 0}},
		[]bool{false, true}, []bool{false, false}},
	{"every limit of a quota fits",
		[]quotaCaseHit{{"a1", 0, false, 0}, {"a2", 0, false, 0}, {"b", 1, true, 0}},
		[]bool{true, true, false}, []bool{true, true, false}},
	{"a cost past a limit, denied before the store",
		[]quotaCaseHit{{"o", -1, false, 0}, {"a1", 0, false, 3}, {"a2", 0, false, 0}, {"b", 1, false, 0}},
		[]bool{true, false, true, true}, []bool{true, false, false, true}},
}

// sharedQuotaCases: two quotas with a counter in common are charged
// together or not at all: one quota, whose common counter is answered
// denied when it is over.
var sharedQuotaCases = []quotaCase{
	{"a counter in common, one quota over",
		[]quotaCaseHit{{"o", -1, false, 0}, {"s", 0, false, 0}, {"a", 0, false, 0}, {"s", 1, false, 0}, {"b", 1, true, 0}, {"c", 2, false, 0}},
		[]bool{true, false, true, false, false, true}, []bool{true, false, false, false, false, true}},
	{"a counter in common, both quotas fit",
		[]quotaCaseHit{{"s", 0, false, 0}, {"a", 0, false, 0}, {"s", 1, false, 0}, {"b", 1, false, 0}},
		[]bool{true, true, true, true}, []bool{true, true, true, true}},
}

// decider is a Limiter or a Split.
type decider interface {
	Decide(ctx context.Context, hits []Hit) ([]Verdict, error)
}

// checkQuotaCase decides c's request on d, its hits made by mk, and checks
// the verdicts, then, once settle has waited for the refunds, that each
// counter holds exactly what its hits were charged.
func checkQuotaCase(t *testing.T, d decider, settle func(), c quotaCase, mk func(key string, limit uint32, cost uint64) Hit) {
	t.Helper()
	ctx := context.Background()
	const limit = 2
	hits := make([]Hit, len(c.hits))
	left := map[string]uint64{} // what each counter must have left
	for i, ch := range c.hits {
		if _, ok := left[ch.key]; !ok {
			left[ch.key] = limit
			if ch.full {
				if v, err := d.Decide(ctx, []Hit{mk(ch.key, limit, limit)}); err != nil || !v[0].Charged {
					t.Fatalf("spending %s: %+v %v", ch.key, v, err)
				}
				left[ch.key] = 0
			}
		}
		hits[i] = mk(ch.key, limit, max(ch.cost, 1))
		if ch.group >= 0 {
			hits[i].Quota, hits[i].QuotaGroup = true, uint32(ch.group)
		}
	}
	verdicts, err := d.Decide(ctx, hits)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range verdicts {
		if v.Admitted != c.admitted[i] || v.Charged != c.charged[i] {
			t.Errorf("hit %d (%s): %+v, want admitted %t, charged %t", i, c.hits[i].key, v, c.admitted[i], c.charged[i])
		}
		if c.charged[i] {
			left[c.hits[i].key] -= hits[i].Cost
		}
	}
	settle()
	for key, want := range left {
		v, err := d.Decide(ctx, []Hit{mk(key, limit, 0)})
		if err != nil {
			t.Fatal(err)
		}
		if v[0].Remaining != want {
			t.Errorf("%s has %d left, want %d", key, v[0].Remaining, want)
		}
	}
}

// TestQuotaGroups: the quota hits of one group (a descriptor's limits)
// are one quota, which fits only when each of them fits and charges none
// of them when one does not; a request with quotas fits when one fits.
func TestQuotaGroups(t *testing.T) {
	for _, a := range algorithms {
		for _, c := range append(quotaCases, sharedQuotaCases...) {
			t.Run(a.String()+"/"+c.name, func(t *testing.T) {
				l, _ := newTestLimiter(t, epoch.Add(time.Second))
				checkQuotaCase(t, l, l.refunds.Wait, c, func(key string, limit uint32, cost uint64) Hit {
					return hit(a, key, limit, time.Minute, cost)
				})
			})
		}
	}
}

// decide decides hits as one request and checks which were charged.
func decide(t *testing.T, l *Limiter, hits []Hit, charged []bool) {
	t.Helper()
	vs, err := l.Decide(context.Background(), hits)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if v.Charged != charged[i] {
			t.Fatalf("hit %d of %d: %+v, want charged %t", i, len(hits), v, charged[i])
		}
	}
}

// remainingOf is what a check of h's counter reports left.
func remainingOf(t *testing.T, l *Limiter, h Hit) uint64 {
	t.Helper()
	h.Cost, h.Quota = 0, false
	v, err := l.Decide(context.Background(), []Hit{h})
	if err != nil {
		t.Fatal(err)
	}
	return v[0].Remaining
}
