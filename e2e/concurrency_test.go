package e2e

// A concurrency limit driven by exactly the calls Envoy's rate limit filter
// makes (docs/budgets.md, "Concurrency limits"): the acquisition before
// routing, and from onDestroy the release, for every request whose headers
// it decoded, the ones it denied with a 429 included.

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// concurrencyConfig is the rule docs/budgets.md gives: seats in a log whose
// window is the longest a request may run, released oldest first.
const concurrencyConfig = `
domain: edge
descriptors:
  - key: concurrent_user
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log, refund_order: oldest}
`

// envoyCall is the request Envoy builds from one of the route's rate_limits
// entries for user: the entry's hits_addend number as the descriptor's own
// hits_addend (with is_negative_hits for the release), and no request-level
// hits_addend (0: no envoy.ratelimit.hits_addend filter state).
func envoyCall(user string, release bool) *rlsv3.RateLimitRequest {
	d := descriptor("concurrent_user", user)
	d.HitsAddend = wrapperspb.UInt64(1)
	d.IsNegativeHits = release
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

// TestConcurrencyLimitWithEnvoysCalls: 50 callers for a few seconds, each
// request acquiring a seat on one of two instances and releasing it on the
// other (a release reaching another replica of the service); an admitted
// request holds its seat a random few milliseconds, a denied one releases at
// once, as Envoy does after its 429, and its client backs off a random few
// milliseconds before it tries again. The test counts admitted requests in
// flight, from the OK answer until just before the release is sent: never
// more than the limit. Afterwards every seat is free again.
func TestConcurrencyLimitWithEnvoysCalls(t *testing.T) {
	const callers, limit, run = 50, 5, 3 * time.Second
	const hold, backoff = 20_000, 20_000 // microseconds, at most
	r := startRedis(t)
	servers := []*server{startServer(t, r, concurrencyConfig), startServer(t, r, concurrencyConfig)}
	var inFlight, most, admitted, denied, failed atomic.Int64
	done := make(chan struct{})
	time.AfterFunc(run, func() { close(done) })
	var wg sync.WaitGroup
	for c := range callers {
		acquireOn, releaseOn := servers[c%2], servers[(c+1)%2]
		wg.Go(func() {
			call := func(s *server, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, bool) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := s.rls.ShouldRateLimit(ctx, req)
				if err != nil {
					failed.Add(1)
					return nil, false
				}
				return resp, true
			}
			for {
				select {
				case <-done:
					return
				default:
				}
				resp, ok := call(acquireOn, envoyCall("dana", false))
				if !ok {
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
					n := inFlight.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					pause(nil, time.Duration(rand.IntN(hold))*time.Microsecond) // the request runs
					inFlight.Add(-1)
				} else {
					denied.Add(1)
				}
				// onDestroy: the release, for admitted and denied requests alike.
				if resp, ok := call(releaseOn, envoyCall("dana", true)); ok && resp.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Errorf("release answered %v, want OK", resp.OverallCode)
				}
				if resp.OverallCode != rlsv3.RateLimitResponse_OK {
					pause(nil, time.Duration(rand.IntN(backoff))*time.Microsecond) // the client backs off after its 429
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d admitted, %d denied, at most %d in flight (limit %d), %d errors",
		admitted.Load(), denied.Load(), most.Load(), limit, failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	if most.Load() > limit {
		t.Fatalf("%d admitted requests in flight at once, limit %d", most.Load(), limit)
	}
	if admitted.Load() == 0 || denied.Load() == 0 {
		t.Fatalf("%d admitted, %d denied: the limit was not contended", admitted.Load(), denied.Load())
	}
	// Every acquisition was released: a new request finds every seat free.
	for _, s := range servers {
		resp := s.ask(t, envoyCall("dana", false))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != limit-1 {
			t.Fatalf("acquisition after the run: %v, want OK with %d remaining", resp, limit-1)
		}
		s.ask(t, envoyCall("dana", true))
	}
}
