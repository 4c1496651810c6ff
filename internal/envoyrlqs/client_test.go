package envoyrlqs

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

var (
	b1 = map[string]string{"name": "b1", "tenant": "t"}
	b2 = map[string]string{"name": "b2"}
)

// usageOf returns the usage of bucket in r, or nil.
func usageOf(r *rlqspb.RateLimitQuotaUsageReports, bucket map[string]string) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	for _, u := range r.GetBucketQuotaUsages() {
		if bucketKey(u.GetBucketId().GetBucket()) == bucketKey(bucket) {
			return u
		}
	}
	return nil
}

// checkAlone fails t unless r is a new bucket's report: that bucket alone,
// the domain, time_elapsed 0 and the one request.
func checkAlone(t *testing.T, r *rlqspb.RateLimitQuotaUsageReports, bucket map[string]string, allowed bool) {
	t.Helper()
	u := usageOf(r, bucket)
	if r.GetDomain() != "d" || len(r.GetBucketQuotaUsages()) != 1 || u == nil {
		t.Fatalf("report %v, want %v's alone in domain d", r, bucket)
	}
	a, d := uint64(0), uint64(1)
	if allowed {
		a, d = 1, 0
	}
	if u.GetNumRequestsAllowed() != a || u.GetNumRequestsDenied() != d {
		t.Fatalf("report %v, want allowed %d denied %d", u, a, d)
	}
	if te := u.GetTimeElapsed(); te == nil || te.GetSeconds() != 0 || te.GetNanos() != 0 {
		t.Fatalf("time_elapsed %v, want 0s", te)
	}
}

// TestFirstReports: the stream opens at the first bucket, not before; each
// new bucket is reported at once, alone, with its first request decided by
// no_assignment_behavior (only DENY_ALL denies it). The report period is an
// hour, so every message seen is a new bucket's.
func TestFirstReports(t *testing.T) {
	perUnit := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 0}}}
	cases := []struct {
		name         string
		noAssignment *typev3.RateLimitStrategy
		allowed      bool
	}{
		{"unset: ALLOW_ALL", nil, true},
		{"ALLOW_ALL", allowAll, true},
		{"DENY_ALL", denyAll, false},
		{"requests_per_time_unit 0: not enforced", perUnit, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := e.client(Options{ReportInterval: time.Hour, NoAssignment: tc.noAssignment})
			if s := c.Stats(); s.StreamsOpened != 0 {
				t.Fatalf("stream opened before any bucket: %+v", s)
			}
			if got := c.Allow(b1); got != tc.allowed {
				t.Fatalf("first request allowed %v, want %v", got, tc.allowed)
			}
			wait(t, "b1's report", func() bool { return len(e.srv.all()) == 1 })
			checkAlone(t, e.srv.all()[0], b1, tc.allowed)
			if got := c.Allow(b2); got != tc.allowed {
				t.Fatalf("b2's first request allowed %v, want %v", got, tc.allowed)
			}
			wait(t, "b2's report", func() bool { return len(e.srv.all()) == 2 })
			checkAlone(t, e.srv.all()[1], b2, tc.allowed)
			if s := c.Stats(); s.StreamsOpened != 1 || s.ReportsSent != 2 || len(e.srv.reports()) != 1 {
				t.Fatalf("stats %+v, server streams %d: want one stream, two reports", s, len(e.srv.reports()))
			}
			kind := map[bool]Kind{true: KindAllowAll, false: KindDenyAll}[tc.allowed]
			if tc.noAssignment == perUnit {
				kind = KindFailOpen
			}
			if a := c.Assignment(b1); a.Kind != kind || a.From != FromDefault {
				t.Fatalf("assignment %+v, want kind %v from the default", a, kind)
			}
		})
	}
}

// TestPeriodicReports: every tick reports every bucket, zero usage included,
// with the domain, the counts since the last report and time_elapsed in whole
// seconds of the clock.
func TestPeriodicReports(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: 50 * time.Millisecond})
	for range 4 {
		c.Allow(b1)
	}
	c.Allow(b2)
	withBoth := func() []*rlqspb.RateLimitQuotaUsageReports {
		var out []*rlqspb.RateLimitQuotaUsageReports
		for _, r := range e.srv.all() {
			if usageOf(r, b1) != nil && usageOf(r, b2) != nil {
				out = append(out, r)
			}
		}
		return out
	}
	wait(t, "three reports of both buckets", func() bool { return len(withBoth()) >= 3 })
	sum := map[string]uint64{}
	for _, r := range e.srv.all() {
		if r.GetDomain() != "d" {
			t.Fatalf("report without the domain: %v", r)
		}
		for _, u := range r.GetBucketQuotaUsages() {
			sum[u.GetBucketId().GetBucket()["name"]] += u.GetNumRequestsAllowed()
			if u.GetTimeElapsed().GetSeconds() != 0 {
				t.Fatalf("time_elapsed %v on a frozen clock", u.GetTimeElapsed())
			}
		}
	}
	if sum["b1"] != 4 || sum["b2"] != 1 {
		t.Fatalf("allowed over all reports %v, want b1 4, b2 1 (each request once)", sum)
	}
	last := withBoth()[len(withBoth())-1]
	for _, b := range []map[string]string{b1, b2} {
		if u := usageOf(last, b); u.GetNumRequestsAllowed() != 0 || u.GetNumRequestsDenied() != 0 {
			t.Fatalf("idle bucket reported %v, want zero counts", u)
		}
	}
	e.clock.Advance(7500 * time.Millisecond)
	wait(t, "a report with time_elapsed 7s", func() bool {
		for _, r := range e.srv.all() {
			if usageOf(r, b1).GetTimeElapsed().GetSeconds() == 7 {
				if got := usageOf(r, b2).GetTimeElapsed().GetSeconds(); got != 7 {
					t.Fatalf("b2's time_elapsed %d in the report where b1's is 7", got)
				}
				return true
			}
		}
		return false
	})
}

// TestDenyAllAssignment: a server DENY_ALL denies every request, counted.
func TestDenyAllAssignment(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: 50 * time.Millisecond})
	c.Allow(b1)
	wait(t, "the stream", func() bool { return len(e.srv.all()) >= 1 })
	e.srv.push(t, assign(b1, denyAll, hour))
	wait(t, "DENY_ALL applied", func() bool { return c.Assignment(b1).Kind == KindDenyAll })
	for range 4 {
		if c.Allow(b1) {
			t.Fatal("allowed under DENY_ALL")
		}
	}
	wait(t, "4 denials reported", func() bool {
		var denied, allowed uint64
		for _, r := range e.srv.all() {
			denied += usageOf(r, b1).GetNumRequestsDenied()
			allowed += usageOf(r, b1).GetNumRequestsAllowed()
		}
		return denied == 4 && allowed == 1
	})
}

// TestStreamDropReopensOnTick: a closed stream is reopened by the next tick,
// whose first message is the periodic report of every bucket.
func TestStreamDropReopensOnTick(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: 50 * time.Millisecond})
	c.Allow(b1)
	c.Allow(b2)
	wait(t, "both first reports", func() bool { return len(e.srv.all()) >= 2 })
	e.srv.endStream(t)
	wait(t, "a second stream with a report", func() bool {
		rs := e.srv.reports()
		return len(rs) == 2 && len(rs[1]) > 0
	})
	first := e.srv.reports()[1][0]
	if first.GetDomain() != "d" || usageOf(first, b1) == nil || usageOf(first, b2) == nil {
		t.Fatalf("first message on the new stream %v, want the report of every bucket", first)
	}
	if s := c.Stats(); s.StreamsOpened != 2 || s.StreamsClosed != 1 {
		t.Fatalf("stats %+v, want 2 streams opened, 1 closed", s)
	}
}

// TestServerDown: with the server gone, each tick's report is built (counts
// reset) and dropped; the assignment and its timer stay; when the server
// returns a tick reopens the stream with the report of every bucket, the
// usage of the down time lost.
func TestServerDown(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: 50 * time.Millisecond})
	c.Allow(b1)
	wait(t, "the first report", func() bool { return len(e.srv.all()) >= 1 })
	e.srv.push(t, assign(b1, denyAll, hour))
	wait(t, "DENY_ALL applied", func() bool { return c.Assignment(b1).Kind == KindDenyAll })
	held := c.Assignment(b1)
	e.stop()
	wait(t, "the stream closed", func() bool { return c.Stats().StreamsClosed == 1 })
	for range 5 {
		c.Allow(b1)
	}
	dropped := c.Stats().ReportsDropped
	// Two more drops: the second was built after the five denials.
	wait(t, "reports dropped", func() bool { return c.Stats().ReportsDropped >= dropped+2 })
	if s := c.Stats(); s.StreamStartFailures == 0 {
		t.Fatalf("stats %+v: no failed start while the server is down", s)
	}
	if a := c.Assignment(b1); a != held {
		t.Fatalf("assignment %+v while the server is down, want it kept: %+v", a, held)
	}
	e.restart()
	wait(t, "a report on the new server", func() bool { return len(e.srv.all()) > 0 })
	u := usageOf(e.srv.all()[0], b1)
	if u == nil || u.GetNumRequestsDenied() != 0 || u.GetNumRequestsAllowed() != 0 {
		t.Fatalf("first report after the restart %v, want b1 with the down time's usage dropped", e.srv.all()[0])
	}
}

// TestAbandon: abandon_action erases the bucket; its next request makes it
// anew: decided by the default and reported at once, alone.
func TestAbandon(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: time.Hour})
	c.Allow(b1)
	wait(t, "the first report", func() bool { return len(e.srv.all()) == 1 })
	e.srv.push(t, assign(b1, denyAll, hour))
	wait(t, "DENY_ALL applied", func() bool { return c.Assignment(b1).Kind == KindDenyAll })
	if c.Allow(b1) {
		t.Fatal("allowed under DENY_ALL")
	}
	e.srv.push(t, abandon(b1))
	wait(t, "b1 erased", func() bool { return c.Assignment(b1).Kind == KindNone })
	if !c.Allow(b1) {
		t.Fatal("denied after abandon: want the default ALLOW_ALL")
	}
	wait(t, "b1 reported again", func() bool { return len(e.srv.all()) == 2 })
	checkAlone(t, e.srv.all()[1], b1, true)
}

// TestConcurrentAllow: many goroutines on one token bucket take exactly its
// tokens on a frozen clock, and every request is reported once.
func TestConcurrentAllow(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: 50 * time.Millisecond})
	c.Allow(b1)
	wait(t, "the first report", func() bool { return len(e.srv.all()) >= 1 })
	e.srv.push(t, assign(b1, tokenBucketStrategy(1000, 1, durationpb.New(time.Second)), hour))
	wait(t, "the token bucket", func() bool { return c.Assignment(b1).Kind == KindTokenBucket })
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				if c.Allow(b1) {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 1000 {
		t.Fatalf("%d allowed, want the bucket's 1000", allowed.Load())
	}
	wait(t, "every request reported", func() bool {
		var a, d uint64
		for _, r := range e.srv.all() {
			a += usageOf(r, b1).GetNumRequestsAllowed()
			d += usageOf(r, b1).GetNumRequestsDenied()
		}
		return a == 1001 && d == 3000
	})
}

// TestAllowAllocatesNothing: a known bucket's request allocates nothing.
func TestAllowAllocatesNothing(t *testing.T) {
	e := newEnv(t)
	c := e.client(Options{ReportInterval: time.Hour})
	c.Allow(b1)
	wait(t, "b1 created", func() bool { return c.Assignment(b1).Kind != KindNone })
	if n := testing.AllocsPerRun(100, func() { c.Allow(b1) }); n != 0 {
		t.Fatalf("%v allocations per Allow", n)
	}
}

// BenchmarkAllow: the load generator's hot path, a known token bucket
// decided from many goroutines.
func BenchmarkAllow(b *testing.B) {
	e := newEnv(b)
	c := e.client(Options{ReportInterval: time.Hour})
	c.Allow(b1)
	wait(b, "the first report", func() bool { return len(e.srv.all()) == 1 })
	e.srv.push(b, assign(b1, tokenBucketStrategy(1_000_000, 1_000_000, durationpb.New(time.Second)), hour))
	wait(b, "the token bucket", func() bool { return c.Assignment(b1).Kind == KindTokenBucket })
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Allow(b1)
		}
	})
}

func TestNoAssignmentTokenBucketRefused(t *testing.T) {
	c, err := New(nil, Options{NoAssignment: tokenBucketStrategy(1, 1, durationpb.New(time.Second))})
	if !errors.Is(err, ErrNoAssignmentTokenBucket) || c != nil {
		t.Fatalf("New with a token bucket as no_assignment_behavior: %v, %v; want ErrNoAssignmentTokenBucket", c, err)
	}
}
