package e2e

// Issue 33's seats that name themselves, driven by exactly the calls Envoy's
// rate limit filter makes (docs/budgets.md, "Concurrency limits"): the
// acquisition before routing; when the stream is done, a descriptor whose
// last entry a metadata action takes from the first answer's
// dynamic_metadata (namespace envoy.filters.http.ratelimit, path
// [leases, concurrent_user]). A denied answer carries no id, so Envoy drops
// that descriptor and sends no release.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// leaseConfig: 5 seats per user, and a token budget with reservations; the
// lost seats' rule frees an unreleased seat after a second.
const leaseConfig = `
domain: edge
descriptors:
  - key: concurrent_user
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log, leases: true}
  - key: lost_user
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: sliding_window_log, leases: true, lease_ttl: 1s}
  - key: tokens_user
    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: sliding_window_log, leases: true, lease_ttl: 1s}
`

// acquisition is the request Envoy builds before routing: the entry's
// hits_addend as the descriptor's own.
func acquisitionCall(key, user string, cost uint64) *rlsv3.RateLimitRequest {
	d := descriptor(key, user)
	d.HitsAddend = wrapperspb.UInt64(cost)
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

// streamDoneCall is the request Envoy builds when the stream is done from
// the route entry {request_headers -> key, metadata {descriptor_key: lease,
// metadata_key: {key: envoy.filters.http.ratelimit, path: [leases, key]}}}
// with hits_addend (a release: {number: 1, is_negative_hits: true}; a
// settlement: the actual cost). The metadata action reads a string value
// from the metadata the first answer set; absent or empty, with no
// default_value and skip_if_absent false, the descriptor is not produced:
// nil, no call.
func streamDoneCall(first *rlsv3.RateLimitResponse, key, user string, actual *uint64) *rlsv3.RateLimitRequest {
	id := first.GetDynamicMetadata().GetFields()["leases"].GetStructValue().GetFields()[key].GetStringValue()
	if id == "" {
		return nil
	}
	d := descriptor(key, user, "lease", id)
	if actual == nil {
		d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(1), true
	} else {
		d.HitsAddend = wrapperspb.UInt64(*actual)
	}
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

// TestLeasedSeatsWithEnvoysCalls: 50 callers retrying at once on 5 seats for
// 10 s over two instances on one redis-server, each admitted request holding
// its seat 100 ms and releasing it on the other instance. Never more than 5
// in flight; the admissions are logged against the ideal 500 (5 seats of
// 100 ms for 10 s), and asserted above a bound a loaded 2-core machine keeps
// with the race detector on (the shipped binary's figure is make bench's
// seats/leases; the exact one TestLeasedSeatsUnderContention's, in
// internal/limiter, on a frozen clock). Then: a lost release frees its seat
// at the TTL; a reservation of 1,000 tokens settled at 300 leaves 300
// charged, and one never settled is released at its TTL.
func TestLeasedSeatsWithEnvoysCalls(t *testing.T) {
	t.Parallel()
	const callers, limit, run, hold = 50, 5, 10 * time.Second, 100 * time.Millisecond
	r := startRedis(t)
	servers := []*server{startServer(t, r, leaseConfig), startServer(t, r, leaseConfig)}
	call := func(s *server, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return s.rls.ShouldRateLimit(ctx, req)
	}
	var inFlight, most, admitted, denied, failed, releases atomic.Int64
	var acquiring, releasing atomic.Int64 // the admitted acquisitions' and the releases' time in calls, ns
	done := make(chan struct{})
	time.AfterFunc(run, func() { close(done) })
	var wg sync.WaitGroup
	for c := range callers {
		acquireOn, releaseOn := servers[c%2], servers[(c+1)%2]
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				first, err := call(acquireOn, acquisitionCall("concurrent_user", "dana", 1))
				took := time.Since(start)
				if err != nil {
					failed.Add(1)
					return
				}
				ok := first.OverallCode == rlsv3.RateLimitResponse_OK
				if ok {
					admitted.Add(1)
					acquiring.Add(int64(took))
					n := inFlight.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(hold) // the request runs
					inFlight.Add(-1)
				} else {
					denied.Add(1)
				}
				// onDestroy: the stream-done call, built from the first answer.
				release := streamDoneCall(first, "concurrent_user", "dana", nil)
				if (release != nil) != ok {
					t.Errorf("answer %v with metadata %v: a release exists %t, want %t", first.OverallCode,
						first.GetDynamicMetadata(), release != nil, ok)
				}
				if release == nil {
					continue // retry at once
				}
				releases.Add(1)
				start = time.Now()
				if resp, err := call(releaseOn, release); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Errorf("release: %v %v, want OK", resp, err)
				}
				releasing.Add(int64(time.Since(start)))
			}
		})
	}
	wg.Wait()
	ideal := int64(run/hold) * limit
	t.Logf("%d admitted of an ideal %d (%.0f %%), %d denied, %d releases, at most %d in flight (limit %d), %d errors",
		admitted.Load(), ideal, 100*float64(admitted.Load())/float64(ideal), denied.Load(), releases.Load(), most.Load(), limit, failed.Load())
	if n := admitted.Load(); n > 0 {
		// A seat is busy for its request's hold and its release's call (the
		// waiting callers' acquisitions are already on their way): what
		// this machine's speed allows.
		acq, rel := time.Duration(acquiring.Load()/n), time.Duration(releasing.Load()/n)
		allowed := float64(limit) * float64(run) / float64(hold+rel)
		t.Logf("mean admitted acquisition %v, mean release %v: at most about %.0f admissions at this speed; %.0f %% of that",
			acq.Round(time.Microsecond), rel.Round(time.Microsecond), allowed, 100*float64(n)/allowed)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	if most.Load() > limit {
		t.Fatalf("%d admitted requests in flight at once, limit %d", most.Load(), limit)
	}
	if releases.Load() != admitted.Load() {
		t.Fatalf("%d releases for %d admitted requests: the denied ones must send none", releases.Load(), admitted.Load())
	}
	// The bound a loaded machine keeps: a quarter of the ideal (the run
	// above measured 298 and 305 of 500 at a load average of 20 on 2 cores,
	// calls taking 55 to 60 ms each; 341 at a load average of 10). The
	// metadata-free mode starves far below it (issue 24's test: 7 to 23
	// admissions in 3 s).
	if admitted.Load() < ideal/4 {
		t.Fatalf("%d admitted, want at least a quarter of the ideal %d even on a loaded machine", admitted.Load(), ideal)
	}
	// Every seat was released: all 5 are free.
	for i := range limit {
		if resp, err := call(servers[i%2], acquisitionCall("concurrent_user", "erin", 1)); err != nil ||
			resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("seat %d of %d for another user: %v %v", i+1, limit, resp, err)
		}
	}
	if resp := servers[0].ask(t, acquisitionCall("concurrent_user", "dana", 5)); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("all 5 of dana's seats after the run: %v, want every seat free", resp)
	}

	// A lost release: the seat frees itself at its TTL (1 s).
	// Timed from before the acquisition was sent: Redis starts the TTL
	// somewhere inside the call, never before it.
	taken := time.Now()
	lost := servers[0].ask(t, acquisitionCall("lost_user", "u", 1))
	if lost.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("lost seat: %v", lost)
	}
	if resp := servers[1].ask(t, acquisitionCall("lost_user", "u", 1)); resp.OverallCode == rlsv3.RateLimitResponse_OK &&
		time.Since(taken) < time.Second {
		t.Fatalf("a second seat while the lost one lives: %v", resp)
	}
	waitFor(t, 5*time.Second, func() error {
		if resp := servers[1].ask(t, acquisitionCall("lost_user", "u", 1)); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			return errors.New("the lost seat is still taken")
		}
		return nil
	})
	if freed := time.Since(taken); freed < time.Second {
		t.Fatalf("the lost seat was free after %v, before its TTL of 1 s", freed)
	} else {
		t.Logf("the lost seat was free again %v after it was taken (TTL 1 s)", freed.Round(time.Millisecond))
	}

	// A reservation of 1,000 tokens settled at 300 leaves 300 charged; one
	// never settled is released at its TTL.
	res := servers[0].ask(t, acquisitionCall("tokens_user", "u", 1000))
	if res.OverallCode != rlsv3.RateLimitResponse_OK || res.Statuses[0].LimitRemaining != 9000 {
		t.Fatalf("reservation of 1000: %v", res)
	}
	actual := uint64(300)
	if resp := servers[1].ask(t, streamDoneCall(res, "tokens_user", "u", &actual)); resp.Statuses[0].LimitRemaining != 9700 {
		t.Fatalf("settled at 300: %v, want 9700 left", resp)
	}
	servers[0].ask(t, acquisitionCall("tokens_user", "u", 1000)) // never settled
	check := func() uint32 {
		return servers[1].ask(t, acquisitionCall("tokens_user", "u", 0)).Statuses[0].LimitRemaining
	}
	if left := check(); left != 8700 {
		t.Fatalf("with an unsettled reservation of 1000: %d left, want 8700", left)
	}
	waitFor(t, 5*time.Second, func() error {
		if left := check(); left != 9700 {
			return errors.New("the unsettled reservation still counts")
		}
		return nil
	})
}
