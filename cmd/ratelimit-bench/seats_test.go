package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestSeatsConfig: bench.yaml's seats rule is a concurrency limit of
// seatLimit on the log, with leases, its window far longer than a hold.
func TestSeatsConfig(t *testing.T) {
	cfg, err := config.Load("../../bench/config/bench.yaml", config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range seatsCases {
		rule := config.Match(cfg, domain, []*rlcommon.RateLimitDescriptor_Entry{{Key: c.rule(), Value: "u"}})
		switch {
		case rule == nil || rule.Unlimited:
			t.Fatalf("%s: bench.yaml has no limited rule %s", c.Name(), c.rule())
		case rule.RequestsPerUnit != seatLimit || rule.Algorithm.String() != "sliding_window_log":
			t.Errorf("%s: %d per window on %s, want %d on the log", c.Name(), rule.RequestsPerUnit, rule.Algorithm, seatLimit)
		case !rule.Leases:
			t.Errorf("%s: no leases", c.Name())
		case rule.Unit.Duration() < 100*seatHold:
			t.Errorf("%s: window %s, want far longer than a hold of %s", c.Name(), rule.Unit.Duration(), seatHold)
		}
	}
}

// seatsFake answers acquisitions OK, with a lease id, while fewer than
// seats are taken, and records the stream-done calls it gets. It closes
// done at its stopAfter-th acquisition: the caller's run is counted in
// calls, not time, so that a slow machine changes nothing.
type seatsFake struct {
	mu        sync.Mutex
	seats     int
	taken     int
	releases  []*rlcommon.RateLimitDescriptor
	fail      bool // answer acquisitions with an error
	asked     int
	stopAfter int
	done      chan struct{}
}

func (f *seatsFake) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := req.Descriptors[0]
	if d.IsNegativeHits {
		f.releases = append(f.releases, d)
		f.taken--
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	if f.asked++; f.asked == f.stopAfter {
		close(f.done)
	}
	if f.fail {
		return nil, status.Error(codes.Unavailable, "down")
	}
	if f.taken >= f.seats {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	}
	f.taken++
	md, err := structpb.NewStruct(map[string]any{"leases": map[string]any{d.Entries[0].Key: "1.lease"}})
	if err != nil {
		return nil, err
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, DynamicMetadata: md}, nil
}

// TestSeatCaller: a denied acquisition sends no stream-done call and an
// admitted one sends its release naming the lease; a failed acquisition is
// let through (its request runs), counted apart, and sends no release (its
// answer has no lease id).
func TestSeatCaller(t *testing.T) {
	for _, tc := range []struct {
		fail       bool
		releaseKVs []string // the release's entries
	}{
		{releaseKVs: []string{"k", "u", "lease", "1.lease"}},
		{fail: true},
	} {
		// One seat, already taken: denied until a release. Three acquisitions.
		fake := &seatsFake{seats: 1, taken: 1, fail: tc.fail, stopAfter: 3, done: make(chan struct{})}
		counts := &seatCounts{errors: map[string]int{}}
		seatCaller(time.Second, fake, fake, "k", "u", counts, fake.done)
		fake.mu.Lock()
		releases := fake.releases
		fake.mu.Unlock()
		admitted, denied, lost := counts.admitted.Load(), counts.denied.Load(), counts.lost.Load()
		name := fmt.Sprintf("failing %t", tc.fail)
		switch {
		case admitted+denied+lost != 3:
			t.Errorf("%s: %d acquisitions (%d admitted, %d denied, %d failed), want the 3 before done", name,
				admitted+denied+lost, admitted, denied, lost)
		case tc.fail && (lost == 0 || admitted+denied != 0 || counts.mostLetThrough.Load() != 1 || counts.mostInFlight.Load() != 0):
			t.Errorf("%s, failing: %d lost, %d admitted, %d denied, %d let through", name, lost, admitted, denied, counts.mostLetThrough.Load())
		case !tc.fail && (denied == 0 || lost != 0):
			t.Errorf("%s: %d denied, %d lost, want denials only (the seat is taken)", name, denied, lost)
		case int64(len(releases)) != admitted:
			t.Errorf("%s: %d releases for %d admitted", name, len(releases), admitted)
		}
		for _, d := range releases {
			var kvs []string
			for _, e := range d.Entries {
				kvs = append(kvs, e.Key, e.Value)
			}
			if strings.Join(kvs, " ") != strings.Join(tc.releaseKVs, " ") || d.GetHitsAddend().GetValue() != 1 {
				t.Errorf("%s: release %v, want entries %v and 1 hit back", name, d, tc.releaseKVs)
			}
		}
		if !tc.fail {
			// A release from elsewhere frees the seat: the caller takes it and releases it by its id.
			fake.mu.Lock()
			fake.taken, fake.asked, fake.stopAfter, fake.done = 0, 0, 1, make(chan struct{})
			fake.mu.Unlock()
			counts := &seatCounts{errors: map[string]int{}}
			seatCaller(time.Second, fake, fake, "k", "u", counts, fake.done)
			if counts.admitted.Load() != 1 || len(fake.releases) != 1 || counts.mostInFlight.Load() != 1 {
				t.Errorf("%s: %d admitted, %d releases, at most %d in flight; want 1, 1, 1",
					name, counts.admitted.Load(), len(fake.releases), counts.mostInFlight.Load())
			}
		}
	}
}

// TestSeatsReport: the ideal is the seats' holds end to end over the time
// acquisitions were sent; the table shows each run.
func TestSeatsReport(t *testing.T) {
	r := &SeatsRun{Duration: 10 * time.Second, Elapsed: 10200 * time.Millisecond,
		Admitted: 475, Denied: 93000, Releases: 475, MostInFlight: 5, MostLetThrough: 6,
		Errors: map[string]int{"DeadlineExceeded": 2}}
	if r.Ideal() != 500 {
		t.Errorf("ideal %.1f, want 500 (5 seats of 100 ms for 10 s)", r.Ideal())
	}
	var b strings.Builder
	writeSeats(&b, options{timeout: 20 * time.Millisecond}, []*SeatsRun{r})
	if want := "| seats/leases | 10s | 475 | 500 | 95.0 | 5 | 6 | 93000 | 475 | DeadlineExceeded 2 |"; !strings.Contains(b.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, b.String())
	}
	for _, tc := range []struct {
		run      string
		duration time.Duration
		want     int
	}{{"", 10 * time.Second, 1}, {"seats/leases", time.Second, 1}, {"seats", 0, 0}, {"log/", time.Second, 0}} {
		if got, err := selectSeats(tc.run, tc.duration); err != nil || len(got) != tc.want {
			t.Errorf("selectSeats(%q, %s): %v, %v; want %d", tc.run, tc.duration, got, err, tc.want)
		}
	}
}
