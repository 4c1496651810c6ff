package limiter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/netproxy"
	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// Leases on a frozen clock (miniredis, whose TIME the test sets): seats that
// name themselves, expire at their TTL, and reservations settled by their
// actual cost (docs/budgets.md).

func seat(key string, limit uint32, window, ttl time.Duration) Hit {
	h := hit(config.SlidingWindowLog, key, limit, window, 1)
	h.Lease, h.LeaseTTL = true, ttl
	return h
}

func settle(key string, limit uint32, window time.Duration, id string, actual uint64) Hit {
	h := hit(config.SlidingWindowLog, key, limit, window, actual)
	h.Settle = id
	return h
}

// TestLeaseIDs: an id is "<units>.<32 hex digits>", fresh each time, and
// whatever else a client may send parses as no lease.
func TestLeaseIDs(t *testing.T) {
	a, b := leaseID(1, newNonce()), leaseID(1, newNonce())
	if a == b || len(a) != 34 {
		t.Fatalf("ids %q and %q: want two distinct ids of 34 bytes", a, b)
	}
	if n, u, ok := parseLease(a); !ok || u != 1 || "1."+n != a {
		t.Fatalf("parseLease(%q) = %q, %d, %t", a, n, u, ok)
	}
	for _, bad := range []string{"", "1", "1.", "0." + strings.Repeat("a", 32), "x." + strings.Repeat("a", 32),
		"1." + strings.Repeat("A", 32), "1." + strings.Repeat("a", 31), "1." + strings.Repeat("g", 32),
		"-1." + strings.Repeat("a", 32), "1." + strings.Repeat("a", 33)} {
		if _, _, ok := parseLease(bad); ok {
			t.Errorf("parseLease(%q): ok, want no lease", bad)
		}
	}
}

// TestLeaseFreesItsOwnSeatOnce: a settlement at 0 frees exactly the seat its
// id names, once; a second one, a forged id and a malformed one free nothing
// and are answered admitted, without error.
func TestLeaseFreesItsOwnSeatOnce(t *testing.T) {
	const limit, window = 2, time.Minute
	l, c := newTestLimiter(t, epoch)
	a := decide1(t, l, seat("u", limit, window, 0))
	c.add(time.Millisecond)
	b := decide1(t, l, seat("u", limit, window, 0))
	if !a.Charged || !b.Charged || a.Lease == "" || b.Lease == "" || a.Lease == b.Lease {
		t.Fatalf("two seats: %+v %+v, want both charged with distinct leases", a, b)
	}
	if v := decide1(t, l, seat("u", limit, window, 0)); v.Admitted || v.Charged || v.Lease != "" {
		t.Fatalf("a third seat: %+v, want denied, nothing charged and no lease", v)
	}
	nonce, _, _ := parseLease(a.Lease)
	// One hex digit off a's: a digit other than its last (the random nonce
	// ends in '0' one time in 16).
	last := "0"
	if nonce[31] == '0' {
		last = "1"
	}
	forged := []string{"1." + strings.Repeat("0", 32), "1." + nonce[:31] + last, "junk", b.Lease + "x"}
	for _, id := range forged {
		v := decide1(t, l, settle("u", limit, window, id, 0))
		if !v.Admitted || v.Remaining != 0 {
			t.Fatalf("settling %q: %+v, want admitted, nothing freed (0 remaining)", id, v)
		}
	}
	if v := decide1(t, l, settle("u", limit, window, a.Lease, 0)); !v.Admitted || v.Remaining != 1 {
		t.Fatalf("settling a's lease: %+v, want one seat free", v)
	}
	if v := decide1(t, l, settle("u", limit, window, a.Lease, 0)); v.Remaining != 1 {
		t.Fatalf("settling a's lease again: %+v, want still one seat free (b's stays)", v)
	}
	if v := decide1(t, l, seat("u", limit, window, 0)); !v.Admitted {
		t.Fatalf("after a's release: %+v, want a seat", v)
	}
	if v := decide1(t, l, seat("u", limit, window, 0)); v.Admitted {
		t.Fatalf("b still holds its seat: %+v, want denied", v)
	}
}

// TestLeaseExpiresAtItsTTL: a seat whose release never comes frees itself
// at its TTL, to the microsecond; by default, and at most, the TTL is the
// window.
func TestLeaseExpiresAtItsTTL(t *testing.T) {
	for _, tc := range []struct {
		name              string
		ttl, window, want time.Duration
	}{
		{"shorter than the window", 5 * time.Second, time.Minute, 5 * time.Second},
		{"the window (default)", 0, 10 * time.Second, 10 * time.Second},
		{"longer than the window: the window", 90 * time.Second, time.Minute, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			if v := decide1(t, l, seat("u", 1, tc.window, tc.ttl)); !v.Charged {
				t.Fatalf("seat: %+v", v)
			}
			ttl := tc.want
			c.set(epoch.Add(ttl - time.Microsecond))
			if v := decide1(t, l, seat("u", 1, tc.window, tc.ttl)); v.Admitted {
				t.Fatalf("1 µs before the TTL: %+v, want denied", v)
			}
			c.set(epoch.Add(ttl))
			if v := decide1(t, l, seat("u", 1, tc.window, tc.ttl)); !v.Admitted {
				t.Fatalf("at the TTL: %+v, want the lost seat free", v)
			}
		})
	}
}

// TestReservationTrueUp: a reservation of 1,000 tokens settled at 300 leaves
// the budget charged 300, from the settlement on, for a window; settled above
// its estimate it charges the actual cost, past the limit too; one never
// settled is given back at its TTL.
func TestReservationTrueUp(t *testing.T) {
	const limit, window, ttl = 10_000, time.Hour, 5 * time.Minute
	reserve := func(cost uint64) Hit {
		h := seat("tokens", limit, window, ttl)
		h.Cost = cost
		return h
	}
	left := func(l *Limiter) uint64 { return seatsLeft(t, l, "tokens", limit, window) }
	l, c := newTestLimiter(t, epoch)
	r := decide1(t, l, reserve(1000))
	if !r.Charged || !strings.HasPrefix(r.Lease, "1000.") || left(l) != 9000 {
		t.Fatalf("reservation of 1000: %+v, %d left; want charged, a lease of 1000, 9000 left", r, left(l))
	}
	c.add(time.Second)
	if v := decide1(t, l, settle("tokens", limit, window, r.Lease, 300)); !v.Admitted || v.Remaining != 9700 {
		t.Fatalf("settled at 300: %+v, want 9700 remaining", v)
	}
	// Past the reservation's TTL, the 300 stay: charged at the settlement,
	// for a window.
	c.set(epoch.Add(window))
	if got := left(l); got != 9700 {
		t.Fatalf("a window after the reservation (less than one after the settlement): %d left, want 9700", got)
	}
	c.set(epoch.Add(window + time.Second))
	if got := left(l); got != limit {
		t.Fatalf("a window after the settlement: %d left, want %d", got, limit)
	}

	// Up: the actual cost above the estimate, and above what remains.
	l, _ = newTestLimiter(t, epoch)
	r = decide1(t, l, reserve(9000))
	if v := decide1(t, l, settle("tokens", limit, window, r.Lease, 12_000)); !v.Admitted || v.Remaining != 0 {
		t.Fatalf("settled at 12000 on a limit of 10000: %+v, want recorded (admitted), nothing remaining", v)
	}
	if v := decide1(t, l, reserve(1)); v.Admitted {
		t.Fatalf("after the overdraft: %+v, want denied", v)
	}

	// Never settled: given back at its TTL.
	l, c = newTestLimiter(t, epoch)
	decide1(t, l, reserve(1000))
	c.set(epoch.Add(ttl - time.Microsecond))
	if got := left(l); got != 9000 {
		t.Fatalf("before the TTL: %d left, want 9000", got)
	}
	c.set(epoch.Add(ttl))
	if got := left(l); got != limit {
		t.Fatalf("at the TTL: %d left, want %d (the reservation released)", got, limit)
	}
}

// TestLeasedSeatsUnderContention is the e2e test's load on a frozen clock,
// where the figure is exact: 50 callers on 5 seats, each admitted
// request holding its seat 100 ms and then settling it at 0 (its stream-done
// call), each denied caller trying again 50 ms later and sending no release
// (it has no lease id). Never more than 5 in flight, and at least 90 % of the
// ideal admissions (5 per 100 ms). It runs 2 s of that, not the e2e test's
// 10 s: every call is a Lua script on miniredis, about 4 ms each under the
// race detector, and the figure is the same per second.
func TestLeasedSeatsUnderContention(t *testing.T) {
	const callers, limit, window = 50, 5, time.Minute
	const run, hold, retry = 2 * time.Second, 100 * time.Millisecond, 50 * time.Millisecond
	l, c := newTestLimiter(t, epoch)
	next := make([]time.Duration, callers) // when each caller acts next
	lease := make([]string, callers)       // the seat each holds, or ""
	for i := range next {
		next[i] = time.Duration(i) * retry / callers // staggered
	}
	var admitted, denied, inFlight, most int
	for now := time.Duration(0); now < run; now += time.Millisecond {
		for i := range callers { // releases first: a request that ends now frees its seat now
			if lease[i] != "" && next[i] <= now {
				c.set(epoch.Add(next[i]))
				decide1(t, l, settle("u", limit, window, lease[i], 0))
				lease[i], inFlight = "", inFlight-1
			}
		}
		for i := range callers {
			if lease[i] != "" || next[i] > now {
				continue
			}
			c.set(epoch.Add(next[i]))
			v := decide1(t, l, seat("u", limit, window, 0))
			if !v.Admitted {
				denied++
				next[i] += retry
				continue
			}
			admitted++
			lease[i], inFlight, next[i] = v.Lease, inFlight+1, next[i]+hold
			most = max(most, inFlight)
		}
	}
	ideal := int(run/hold) * limit
	t.Logf("%d admitted (ideal %d), %d denied, at most %d in flight", admitted, ideal, denied, most)
	if most > limit || admitted < ideal*9/10 {
		t.Fatalf("%d admitted, at most %d in flight: want at most %d in flight and at least %d admitted", admitted, most, limit, ideal*9/10)
	}
}

// TestLeasesNeedTheLog: a lease or a settlement on another algorithm is
// refused before anything is sent.
func TestLeasesNeedTheLog(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	h := hit(config.GCRA, "u", 5, time.Minute, 1)
	h.Lease = true
	if _, err := l.Decide(context.Background(), []Hit{h}); !errors.Is(err, errLeaseAlgorithm) {
		t.Fatalf("a lease on gcra: %v, want errLeaseAlgorithm", err)
	}
	h.Lease, h.Settle = false, "1."+strings.Repeat("a", 32)
	if _, err := l.Decide(context.Background(), []Hit{h}); !errors.Is(err, errLeaseAlgorithm) {
		t.Fatalf("a settlement on gcra: %v, want errLeaseAlgorithm", err)
	}
}

// TestLeaseAcrossSlotsIsTakenBack: a lease charged on one cluster slot of a
// request that another slot denies is taken back by its nonce (refund.lua),
// and its verdict carries no lease id.
func TestLeaseAcrossSlotsIsTakenBack(t *testing.T) {
	s := newShards(t, 2, epoch.Add(time.Second), nil)
	full := hitOn("full", 1, 2, config.SlidingWindowLog, 1, 1)
	decide1(t, s.l, full)
	lease := hitOn("seat", 0, 2, config.SlidingWindowLog, 3, 2)
	lease.Lease = true
	v, err := s.l.Decide(context.Background(), []Hit{lease, full})
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Charged || v[0].Lease != "" || v[1].Admitted {
		t.Fatalf("verdicts %+v: want the lease taken back, without an id, and the full hit denied", v)
	}
	s.l.refunds.Wait()
	if got := s.remaining(t, lease); got != 3 {
		t.Fatalf("the lease's counter has %d left after the refund, want 3", got)
	}
}

// TestLeaseMergedWithACheck: a check (cost 0) and a seat on one key in one
// request are one demand, and it is the seat's: charged as a lease whose id
// both verdicts carry, and which its settlement frees.
func TestLeaseMergedWithACheck(t *testing.T) {
	const limit, window = 1, time.Minute
	for _, order := range []string{"check first", "seat first"} {
		t.Run(order, func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch)
			check := hit(config.SlidingWindowLog, "u", limit, window, 0)
			hits := []Hit{check, seat("u", limit, window, 0)}
			if order == "seat first" {
				hits[0], hits[1] = hits[1], hits[0]
			}
			vs, err := l.Decide(context.Background(), hits)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range vs {
				if !v.Admitted || !v.Charged || v.Lease == "" || v.Lease != vs[0].Lease {
					t.Fatalf("hit %d: %+v, want admitted and charged as the one lease of both", i, v)
				}
			}
			if v := decide1(t, l, seat("u", limit, window, 0)); v.Admitted {
				t.Fatalf("a second seat: %+v, want denied while the first is held", v)
			}
			if v := decide1(t, l, settle("u", limit, window, vs[0].Lease, 0)); !v.Admitted || v.Remaining != 1 {
				t.Fatalf("settling the lease: %+v, want its seat free", v)
			}
		})
	}
}

// newSlowLimiter returns a limiter as the service makes it (its client
// stops reading at the deadline, and never retries) on a fresh miniredis
// behind a proxy whose answers a test can slow (the store runs every
// command at once; the way back is slow), its script loaded (a later call
// is sent once).
func newSlowLimiter(t *testing.T) (*Limiter, *slowStore) {
	t.Helper()
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	p, err := netproxy.Start("127.0.0.1:0", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	opts := &redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1} // as redisstore configures it
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	decide1(t, l, seat("warm-up", 1, time.Minute, 0))
	return l, &slowStore{m: m, proxy: p}
}

// slowStore is the store behind newSlowLimiter's proxy.
type slowStore struct {
	m     *miniredis.Miniredis
	proxy *netproxy.Proxy
}

// slow holds every answer read from now on a second, or none.
func (s *slowStore) slow(on bool) {
	d := time.Duration(0)
	if on {
		d = time.Second
	}
	s.proxy.SetDelays(0, d)
}

// inFlight slows answers and starts a call whose batch is then in flight
// for a second: later calls gather behind it. It returns once the store
// ran the call, and the call's error comes on the channel once answered.
// Answers stay slow until slow(false).
func (s *slowStore) inFlight(t *testing.T, l *Limiter) <-chan error {
	t.Helper()
	h := hit(config.SlidingWindowLog, "in-flight", 1_000, time.Minute, 1)
	s.slow(true)
	done := make(chan error, 1)
	go func() {
		_, err := l.Decide(context.Background(), []Hit{h})
		done <- err
	}()
	s.ran(t, h)
	return done
}

// ran waits until the store holds h's key: its call ran.
func (s *slowStore) ran(t *testing.T, h Hit) {
	t.Helper()
	if !waitfor.True(5*time.Second, time.Millisecond, func() bool { return s.m.Exists(h.Key) }) {
		t.Fatalf("%s: not in the store 5 s after its call", h.Key)
	}
}

// TestOrphanedLeaseFreesItsSeat: an acquisition Redis ran but whose answer
// came after its caller left (Envoy answered by failure mode, and will
// never name the lease) gives its seat back, rather than holding it until
// its TTL with nothing running in it. The client stops reading at the
// deadline, so the call's outcome is an error: every lease it asked for is
// settled then. A hit that is no lease keeps its charge, as the request it
// counts went by failure mode.
func TestOrphanedLeaseFreesItsSeat(t *testing.T) {
	const limit, window = 1, time.Minute
	l, slow := newSlowLimiter(t)
	counted := hit(config.SlidingWindowLog, "plain", limit, window, 1)
	slow.slow(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	v, err := l.Decide(ctx, []Hit{seat("u", limit, window, 0), counted})
	cancel()
	slow.slow(false)
	if !errors.Is(err, ErrStore) || !v[0].FailureVerdict || v[0].Lease != "" {
		t.Fatalf("an acquisition answered after its deadline: %+v, %v; want a failure verdict, no lease, and ErrStore", v[0], err)
	}
	if !waitfor.True(5*time.Second, 10*time.Millisecond, func() bool { return seatsLeft(t, l, "u", limit, window) == 1 }) {
		t.Fatal("the orphaned lease still holds its seat 5 s after its deadline")
	}
	if left := seatsLeft(t, l, "plain", limit, window); left != 0 {
		t.Fatalf("the request's plain hit: %d left, want its charge kept (0 left)", left)
	}
	if v := decide1(t, l, seat("u", limit, window, 0)); !v.Admitted || v.Lease == "" {
		t.Fatalf("a seat after the orphan's release: %+v, want admitted with a lease", v)
	}
}

// TestLateReleaseFreesItsSeat: a lease's settlement (Envoy's stream-done
// call, whose answer no one waits for) still queued when its deadline
// passes, behind a batch in flight, is sent all the same: dropped, it would
// hold its seat until its TTL, and sent late it frees only the seat its id
// names. A release that names no seat is not sent late: its acquisition
// may have gone unsent too, and freeing another's seat would admit past
// the limit.
func TestLateReleaseFreesItsSeat(t *testing.T) {
	const limit, window = 2, time.Minute
	l, slow := newSlowLimiter(t)
	leased := decide1(t, l, seat("s", limit, window, 0))
	decide1(t, l, acquisition("anonymous", limit, window))
	inFlight := slow.inFlight(t, l)
	for _, h := range []Hit{settle("s", limit, window, leased.Lease, 0), release("anonymous", limit, window)} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := l.Decide(ctx, []Hit{h})
		cancel()
		if err == nil {
			t.Fatalf("%+v behind a batch held a second, with a 20 ms deadline: answered, want late", h)
		}
	}
	if err := <-inFlight; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	slow.slow(false)
	if !waitfor.True(5*time.Second, 10*time.Millisecond, func() bool { return seatsLeft(t, l, "s", limit, window) == limit }) {
		t.Fatal("the late settlement was not applied 5 s after it was due")
	}
	if left := seatsLeft(t, l, "anonymous", limit, window); left != limit-1 {
		t.Fatalf("the late anonymous release: %d left, want it never sent (%d left)", left, limit-1)
	}
}

// TestOwedCallsOfACallerGone: a lease's settlement and a cost already
// spent (recorded even when denied) whose caller has already gone (Envoy's
// call cancelled) are queued and sent all the same, once: dropped, a seat
// would be held until its TTL, and a spent cost would go uncounted while
// its refund (Envoy's stream-done call) still comes. Sent for a caller
// gone, the call is a check: a plain hit and a lease beside the recorded
// cost are not charged.
func TestOwedCallsOfACallerGone(t *testing.T) {
	const limit, window = 2, time.Minute
	l, _ := newSlowLimiter(t)
	gone := func(hits ...Hit) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _ = l.Decide(ctx, hits) // answered or not, it is applied
	}
	applied := func(key string, left uint64) {
		t.Helper()
		if !waitfor.True(5*time.Second, time.Millisecond, func() bool { return seatsLeft(t, l, key, limit, window) == left }) {
			t.Fatalf("%s: not %d left 5 s after a call whose caller had gone", key, left)
		}
	}
	for range 10 {
		v := decide1(t, l, seat("leased", limit, window, 0))
		gone(settle("leased", limit, window, v.Lease, 0))
		applied("leased", limit)
		gone(acquisition("recorded", limit, window), hit(config.SlidingWindowLog, "plain", limit, window, 1), seat("seat", limit, window, 0))
		applied("recorded", limit-1)
		decide1(t, l, release("recorded", limit, window))
		if left := seatsLeft(t, l, "recorded", limit, window); left != limit {
			t.Fatalf("recorded: %d left after its release, want %d (the acquisition applied once)", left, limit)
		}
	}
	for _, key := range []string{"plain", "seat"} {
		if left := seatsLeft(t, l, key, limit, window); left != limit {
			t.Fatalf("%s, beside a recorded cost whose caller had gone: %d left, want %d (not charged)", key, left, limit)
		}
	}
}

// TestOwedCallKeepsItsPlace: a recorded cost whose caller has gone and its
// refund, queued behind a batch in flight, run in their queue order: the
// refund never comes first (on an empty log it would give back nothing,
// and the cost would then be counted until the window forgets it).
func TestOwedCallKeepsItsPlace(t *testing.T) {
	const limit, window = 2, time.Minute
	l, slow := newSlowLimiter(t)
	inFlight := slow.inFlight(t, l)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = l.Decide(ctx, []Hit{acquisition("kept", limit, window)})
	if _, err := l.Decide(context.Background(), []Hit{release("kept", limit, window)}); err != nil {
		t.Fatalf("the release: %v", err)
	}
	if err := <-inFlight; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	slow.slow(false)
	if left := seatsLeft(t, l, "kept", limit, window); left != limit {
		t.Fatalf("an acquisition and its release, in that order: %d left, want %d", left, limit)
	}
}

// TestCheckedCallAnswersNothing: an owed call sent as a check (its
// deadline passed; its caller may still be waiting, within the margin the
// limiter keeps) applies its recorded cost and charges nothing else, and
// its caller is answered ErrOverloaded, never the check's admissions as if
// decided: its request goes by failure mode.
func TestCheckedCallAnswersNothing(t *testing.T) {
	const limit, window = 2, time.Minute
	l, _ := newSlowLimiter(t)
	b := newBatcher(l.router.(singleRouter).client, 5*time.Second, nil, nil)
	t.Cleanup(b.close)
	hits := []Hit{acquisition("recorded", limit, window), hit(config.SlidingWindowLog, "plain", limit, window, 1)}
	args := []any{len(hits)}
	for i := range hits {
		arg, err := hitArg(&hits[i], nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, arg)
	}
	c := &call{ctx: context.Background(), deadline: time.Now().Add(-time.Millisecond), keys: []string{hits[0].Key, hits[1].Key},
		args: args, lateArgs: lateForm(hits, []int{0, 1}, args), done: make(chan outcome, 1)}
	if c.lateArgs == nil {
		t.Fatal("a recorded cost beside a plain hit: no late form, want one (it is owed to the store)")
	}
	b.exec([]*call{c})
	if o := <-c.done; !errors.Is(o.err, ErrOverloaded) {
		t.Fatalf("the caller of a call sent in its late form: %v %v, want ErrOverloaded", o.vals, o.err)
	}
	if left := seatsLeft(t, l, "recorded", limit, window); left != limit-1 {
		t.Fatalf("recorded: %d left, want its cost applied (%d left)", left, limit-1)
	}
	if left := seatsLeft(t, l, "plain", limit, window); left != limit {
		t.Fatalf("plain: %d left, want nothing charged (%d left)", left, limit)
	}
}

// TestLeaseIsNoRecord: a lease is one kind of operation (Hit.op), and hits
// on one key are one demand: a lease that is also a recorded cost, or beside
// one on its key, is refused, not decided as a plain lease that would leave
// the cost already spent uncounted.
func TestLeaseIsNoRecord(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	rec := hit(config.SlidingWindowLog, "u", 3, time.Minute, 1)
	rec.Record = true
	lease := seat("u", 3, time.Minute, 0)
	both := lease
	both.Record = true
	for _, hits := range [][]Hit{{both}, {rec, lease}} {
		if _, err := l.Decide(context.Background(), hits); !errors.Is(err, errLeaseRecord) {
			t.Errorf("%+v: %v, want %v", hits, err, errLeaseRecord)
		}
	}
}
