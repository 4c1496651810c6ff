package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// splitRouter stands in for a cluster: keys go to servers by slot, and
// each call first waits for wait, when set, as it would for a round trip.
type splitRouter struct {
	servers []redis.UniversalClient
	wait    func(context.Context) error
	masters []redis.UniversalClient // what live reports; nil: all servers
}

func (r splitRouter) slot(key string) int { return keySlot(key) % len(r.servers) }

func (r splitRouter) server(ctx context.Context, key string) (redis.UniversalClient, error) {
	if r.wait != nil {
		if err := r.wait(ctx); err != nil {
			return nil, err
		}
	}
	return r.servers[r.slot(key)], nil
}

// gate holds the calls that wait on it, a round trip that lasts until the
// test opens it, and tells the test of each call that arrives.
type gate struct {
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// newGate returns a closed gate, opened when the test ends at the latest.
func newGate(t *testing.T) *gate {
	g := &gate{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) wait(ctx context.Context) error {
	g.arrived <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// await waits until n more calls are held at the gate.
func (g *gate) await(t *testing.T, n int, what string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for i := range n {
		select {
		case <-g.arrived:
		case <-timeout:
			t.Fatalf("%d of %d calls under way at once: %s", i, n, what)
		}
	}
}

// waitFor polls cond until it holds, failing the test after a while.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !waitfor.True(10*time.Second, time.Millisecond, cond) {
		t.Fatalf("timed out waiting: %s", what)
	}
}

func (splitRouter) failed(error) {}

func (r splitRouter) live(context.Context) ([]redis.UniversalClient, error) {
	if r.masters != nil {
		return r.masters, nil
	}
	return r.servers, nil
}

func (splitRouter) node(_ context.Context, addr string, _ bool) (redis.UniversalClient, error) {
	return nil, fmt.Errorf("no node %s", addr)
}

func (splitRouter) close() {}

type shards struct {
	l       *Limiter
	servers []*miniredis.Miniredis
}

// shards is a limiter over n miniredis servers with frozen clocks at t,
// whose calls wait on wait when it is set.
func newShards(t *testing.T, n int, at time.Time, wait func(context.Context) error) *shards {
	t.Helper()
	s := &shards{}
	var scripters []redis.UniversalClient
	for i := 0; i < n; i++ {
		m, _ := luastore.RunT(t)
		m.SetTime(at)
		client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		t.Cleanup(func() { client.Close() })
		s.servers = append(s.servers, m)
		scripters = append(scripters, client)
	}
	s.l = newWithRouter(splitRouter{servers: scripters, wait: wait}, &Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(s.l.Close)
	return s
}

// hitOn returns a hit named name whose key lives on server i of n.
func hitOn(name string, i, n int, a config.Algorithm, limit uint32, cost uint64) Hit {
	for v := 0; ; v++ {
		h := hit(a, fmt.Sprintf("%s-%d", name, v), limit, time.Minute, cost)
		if keySlot(h.Key)%n == i {
			return h
		}
	}
}

func (s *shards) remaining(t *testing.T, h Hit) uint64 {
	t.Helper()
	h.Cost = 0
	v, err := s.l.Decide(context.Background(), []Hit{h})
	if err != nil {
		t.Fatal(err)
	}
	return v[0].Remaining
}

func TestAcrossSlotsAllOrNothing(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newShards(t, 2, epoch.Add(time.Second), nil)
			free, full := hitOn("free", 0, 2, a, 10, 3), hitOn("full", 1, 2, a, 2, 1)
			decide1(t, s.l, full)
			decide1(t, s.l, full)

			v, err := s.l.Decide(context.Background(), []Hit{free, full})
			if err != nil {
				t.Fatal(err)
			}
			if !v[0].Admitted || v[0].Charged || v[0].Remaining != 10 || v[1].Admitted {
				t.Fatalf("verdicts %+v: want the free hit admitted but refunded (10 left), the full one denied", v)
			}
			s.l.refunds.Wait() // the refund runs after the answer
			if got := s.remaining(t, free); got != 10 {
				t.Fatalf("free counter has %d left after the refund, want 10", got)
			}
			if keys := s.servers[0].Keys(); a == config.SlidingWindowLog && len(keys) != 0 {
				t.Fatalf("log keys left after the refund: %q", keys)
			}

			// Both fit: both charged, on their own servers.
			ok := hitOn("ok", 1, 2, a, 5, 2)
			v, err = s.l.Decide(context.Background(), []Hit{free, ok})
			if err != nil || !v[0].Charged || !v[1].Charged {
				t.Fatalf("both fit: %+v, %v", v, err)
			}
			if s.remaining(t, free) != 7 || s.remaining(t, ok) != 3 {
				t.Fatalf("after charging both: %d and %d left, want 7 and 3", s.remaining(t, free), s.remaining(t, ok))
			}
		})
	}
}

// TestAcrossSlotsFailureModes: a slot whose master is down answers by its
// failure mode, and a deny there refunds the other slots.
func TestAcrossSlotsFailureModes(t *testing.T) {
	for _, mode := range []config.FailureMode{config.FailureDeny, config.FailureAllow} {
		t.Run(mode.String(), func(t *testing.T) {
			s := newShards(t, 2, epoch.Add(time.Second), nil)
			up, down := hitOn("up", 0, 2, config.SlidingWindowCounter, 10, 1), hitOn("down", 1, 2, config.SlidingWindowCounter, 10, 1)
			down.FailureMode = mode
			s.servers[1].Close()
			v, err := s.l.Decide(context.Background(), []Hit{up, down})
			if err == nil {
				t.Fatal("no error with a master down")
			}
			if !v[1].FailureVerdict || v[1].Admitted != (mode == config.FailureAllow) {
				t.Fatalf("down slot: %+v", v[1])
			}
			s.l.refunds.Wait()
			wantLeft := map[config.FailureMode]uint64{config.FailureDeny: 10, config.FailureAllow: 9}[mode]
			if got := s.remaining(t, up); got != wantLeft || v[0].Charged != (mode == config.FailureAllow) {
				t.Fatalf("up slot: verdict %+v, %d left, want %d", v[0], got, wantLeft)
			}
		})
	}
}

// TestAcrossSlotsIsOneRoundTrip: three slots cost one round trip of
// latency: their three calls are under way at once.
func TestAcrossSlotsIsOneRoundTrip(t *testing.T) {
	g := newGate(t)
	s := newShards(t, 3, epoch, g.wait)
	hits := []Hit{hitOn("a", 0, 3, config.FixedWindow, 5, 1), hitOn("b", 1, 3, config.FixedWindow, 5, 1), hitOn("c", 2, 3, config.FixedWindow, 5, 1)}
	type answer struct {
		v   []Verdict
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := s.l.Decide(context.Background(), hits)
		done <- answer{v, err}
	}()
	g.await(t, 3, "the groups did not run at once")
	g.open()
	a := <-done
	if a.err != nil || !a.v[0].Charged || !a.v[1].Charged || !a.v[2].Charged {
		t.Fatalf("%+v, %v", a.v, a.err)
	}
}

// TestRefundDoesNotDelayTheAnswer: a denied request across slots is answered
// within its deadline even when the refund's server is slow: here, while
// the refund's round trip does not end.
func TestRefundDoesNotDelayTheAnswer(t *testing.T) {
	s := newShards(t, 2, epoch.Add(time.Second), nil)
	free, full := hitOn("free", 0, 2, config.FixedWindow, 10, 1), hitOn("full", 1, 2, config.FixedWindow, 1, 1)
	decide1(t, s.l, full)
	g := newGate(t)
	var calls atomic.Int32
	servers := s.l.router.(splitRouter).servers
	s.l.router = splitRouter{servers: servers, wait: func(ctx context.Context) error {
		if calls.Add(1) <= 2 {
			return nil // the request's two slots answer; its refund is held
		}
		return g.wait(ctx)
	}} // no call runs
	type answer struct {
		v   []Verdict
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := s.l.Decide(context.Background(), []Hit{free, full})
		done <- answer{v, err}
	}()
	select {
	case a := <-done:
		if a.err != nil || a.v[1].Admitted || a.v[0].Charged {
			t.Fatalf("%+v, %v", a.v, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer while the refund's round trip lasts: the refund delayed the answer")
	}
	g.await(t, 1, "no refund")
	g.open()
	s.l.refunds.Wait()
	s.l.router = splitRouter{servers: servers}
	if got := s.remaining(t, free); got != 10 {
		t.Fatalf("%d left after the refund, want 10", got)
	}
}

// TestSweepStopsBatchersOfServersThatLeft: after a failover the old master's
// batcher would otherwise idle until Close.
func TestSweepStopsBatchersOfServersThatLeft(t *testing.T) {
	s := newShards(t, 2, epoch, nil)
	decide1(t, s.l, hitOn("a", 0, 2, config.FixedWindow, 5, 1))
	decide1(t, s.l, hitOn("b", 1, 2, config.FixedWindow, 5, 1))
	batchers := func() (n int) {
		s.l.batchers.Range(func(any, any) bool { n++; return true })
		return n
	}
	if n := batchers(); n != 2 {
		t.Fatalf("%d batchers, want 2", n)
	}
	r := s.l.router.(splitRouter)
	s.l.life.Lock() // the router is swapped while no call runs
	s.l.router = splitRouter{servers: r.servers, masters: r.servers[:1]}
	s.l.life.Unlock()
	s.l.sweep(context.Background())
	if n := batchers(); n != 1 {
		t.Fatalf("%d batchers after server 1 left, want 1", n)
	}
	// Server 0 still decides; a server that comes back gets a new batcher.
	decide1(t, s.l, hitOn("a", 0, 2, config.FixedWindow, 5, 1))
	decide1(t, s.l, hitOn("b", 1, 2, config.FixedWindow, 5, 1))
	if n := batchers(); n != 2 {
		t.Fatalf("%d batchers, want 2 again", n)
	}
}

// TestCloseWaitsForCallsInFlight: Close lets a call that started finish and
// answers later calls by failure mode, leaving no batcher behind.
func TestCloseWaitsForCallsInFlight(t *testing.T) {
	g := newGate(t)
	s := newShards(t, 1, epoch, g.wait)
	done := make(chan Verdict)
	go func() {
		v, _ := s.l.Decide(context.Background(), []Hit{hit(config.FixedWindow, "inflight", 5, time.Minute, 1)})
		done <- v[0]
	}()
	g.await(t, 1, "the call is not waiting on its round trip")
	closed := make(chan struct{})
	go func() {
		s.l.Close()
		close(closed)
	}()
	// Close is waiting for the call when a reader can no longer get in.
	waitFor(t, "Close waiting for the call in flight", func() bool {
		if s.l.life.TryRLock() {
			s.l.life.RUnlock()
			return false
		}
		return true
	})
	g.open()
	if v := <-done; !v.Charged {
		t.Fatalf("the call in flight at Close: %+v, want it decided", v)
	}
	<-closed
	v, err := s.l.Decide(context.Background(), []Hit{hit(config.FixedWindow, "late", 5, time.Minute, 1)})
	if !errors.Is(err, ErrClosed) || !v[0].FailureVerdict {
		t.Fatalf("a call after Close: %+v, %v", v, err)
	}
	n := 0
	s.l.batchers.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Fatalf("%d batchers left after Close", n)
	}
}

// TestAcrossSlotsQuotaHits: across slots, a request is kept charged when one
// of its quotas fits on another slot, and refunded when none fits.
func TestAcrossSlotsQuotaHits(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s := newShards(t, 2, epoch.Add(time.Second), nil)
			quota := func(name string, i int, group uint32, limit uint32) Hit {
				h := hitOn(name, i, 2, a, limit, 1)
				h.Quota, h.QuotaGroup = true, group
				return h
			}
			ordinary := hitOn("ordinary", 0, 2, a, 10, 1)
			full, free := quota("full", 0, 0, 1), quota("free", 1, 1, 10)
			decide1(t, s.l, full)
			decide(t, s.l, []Hit{ordinary, full, free}, []bool{true, false, true}) // the fit is on slot 1
			overThere := quota("full-there", 1, 1, 1)
			decide1(t, s.l, overThere)
			decide(t, s.l, []Hit{ordinary, full, overThere}, []bool{false, false, false})
			s.l.refunds.Wait()
			if got := s.remaining(t, ordinary); got != 9 {
				t.Fatalf("ordinary counter has %d left, want 9: the request denied by its quotas was refunded", got)
			}
		})
	}
}

// TestAcrossSlotsQuotaGroups: TestQuotaGroups's requests across two slots,
// a quota's counters on one slot (as a descriptor's, which share a hash
// tag) or spread over both: a slot charges its quota hits that fit, and
// what a quota over or a request denied charged is refunded.
func TestAcrossSlotsQuotaGroups(t *testing.T) {
	byQuota := map[byte]int{'a': 0, 'b': 1, 'c': 0, 'o': 1, 's': 1}
	for _, a := range algorithms {
		for _, layout := range []string{"by quota", "spread"} {
			for _, c := range append(quotaCases, sharedQuotaCases...) {
				t.Run(a.String()+"/"+layout+"/"+c.name, func(t *testing.T) {
					s := newShards(t, 2, epoch.Add(time.Second), nil)
					slotOf := map[string]int{}
					checkQuotaCase(t, s.l, s.l.refunds.Wait, c, func(key string, limit uint32, cost uint64) Hit {
						slot, ok := slotOf[key]
						if !ok {
							slot = len(slotOf) % 2 // spread: each new counter on the other slot
							if layout == "by quota" {
								slot = byQuota[key[0]]
							}
							slotOf[key] = slot
						}
						return hitOn(key, slot, 2, a, limit, cost)
					})
				})
			}
		}
	}
}
