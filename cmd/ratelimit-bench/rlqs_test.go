package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Tests of the RLQS runs (rlqs.go).

// TestRLQSCases checks the RLQS runs each selection makes: each rate's
// ShouldRateLimit run first, added for a selected RLQS run of its rate.
func TestRLQSCases(t *testing.T) {
	names := nameList[RLQSCase]
	for _, tc := range []struct {
		quick    bool
		run      string
		duration time.Duration
		want     string
	}{
		{false, "", 20 * time.Second, "rlqs/ShouldRateLimit/100rps rlqs/3envoys/100rps rlqs/10envoys/100rps " +
			"rlqs/ShouldRateLimit/400rps rlqs/3envoys/400rps rlqs/10envoys/400rps " +
			"rlqs/ShouldRateLimit/1600rps rlqs/3envoys/1600rps rlqs/10envoys/1600rps"},
		{true, "", 15 * time.Second, "rlqs/ShouldRateLimit/400rps rlqs/3envoys/400rps"},
		{false, "10envoys/1600", 20 * time.Second, "rlqs/ShouldRateLimit/1600rps rlqs/10envoys/1600rps"},
		{false, "ShouldRateLimit/100rps", 20 * time.Second, "rlqs/ShouldRateLimit/100rps"},
		{false, "^log/", 20 * time.Second, ""},
		{false, "", 0, ""},
	} {
		got, err := selectRLQS(tc.quick, tc.run, tc.duration)
		if err != nil || names(got) != tc.want {
			t.Errorf("selectRLQS(%v, %q, %v): %q, %v; want %q", tc.quick, tc.run, tc.duration, names(got), err, tc.want)
		}
	}
	if _, err := selectRLQS(false, "(", time.Minute); err == nil {
		t.Error("selectRLQS accepted a bad regexp")
	}
	// The runs' rule admits the highest rate offered: demand stays under the limit.
	cfg, err := config.Load("../../bench/config/bench.yaml", config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	rule := config.Match(cfg, domain, []*rlcommon.RateLimitDescriptor_Entry{{Key: rlqsRuleKey, Value: "e3-r1600"}})
	if rule == nil || rule.Unlimited {
		t.Fatalf("bench.yaml has no limited rule for %s", rlqsRuleKey)
	}
	perSecond := float64(rule.RequestsPerUnit) / rule.Unit.Duration().Seconds()
	if top := slices.Max(rlqsRates); perSecond < float64(top) {
		t.Errorf("rule %s admits %.0f/s, below the %d/s offered", rlqsRuleKey, perSecond, top)
	}
}

func TestCommandCalls(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=300,usec_per_call=42.86,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=30,usec=20,usec_per_call=0.67,rejected_calls=0,failed_calls=0\r\n"
	if n, err := commandCalls(info); err != nil || n != 150 {
		t.Errorf("commandCalls: %d, %v; want 150 (INFO left out)", n, err)
	}
	if _, err := commandCalls("cmdstat_get:calls=x,usec=1\r\n"); err == nil {
		t.Error("commandCalls accepted a bad count")
	}
}

// TestTally checks that only the requests of the measured interval count.
func TestTally(t *testing.T) {
	var c tally
	c.add(true)
	c.phase.Store(measuring)
	c.add(true)
	c.add(false)
	c.phase.Store(stopped)
	c.add(true)
	if c.offered.Load() != 2 || c.admitted.Load() != 1 {
		t.Errorf("offered %d, admitted %d; want 2, 1", c.offered.Load(), c.admitted.Load())
	}
}

// TestPace checks that pace calls at its rate, catching up whatever the
// ticks, and returns when done closes.
func TestPace(t *testing.T) {
	calls := newCallCount()
	done := make(chan struct{})
	returned := make(chan struct{})
	go func() { pace(2000, done, func() { calls.add() }); close(returned) }()
	calls.await(t, 100)
	close(done)
	<-returned
}

// TestRLQSReport checks the RLQS table: commands per admitted request and
// ShouldRateLimit's figure over RLQS's at the same rate.
func TestRLQSReport(t *testing.T) {
	runs := []*RLQSRun{
		{RLQSCase: RLQSCase{Rate: 400}, Elapsed: 5 * time.Second, Offered: 2000, Admitted: 2000, Commands: 8000},
		{RLQSCase: RLQSCase{Envoys: 3, Rate: 400}, Elapsed: 20 * time.Second, Offered: 8000, Admitted: 8000, Commands: 80},
		{RLQSCase: RLQSCase{Envoys: 10, Rate: 1600}, Elapsed: 20 * time.Second, Offered: 32000, Admitted: 0, Commands: 40},
	}
	var b strings.Builder
	writeRLQS(&b, runs)
	out := b.String()
	reportHas(t, out,
		"| ShouldRateLimit | - | 400 | 5s | 2,000 | 2,000 | 8,000 | 1600.0 | 4.0000 | - |",
		"| RLQS | 3 | 400 | 20s | 8,000 | 8,000 | 80 | 4.0 | 0.0100 | 400x |",
		"| RLQS | 10 | 1,600 | 20s | 32,000 | 0 | 40 | 2.0 | 0.0000 | - |",
	)
	b.Reset()
	writeRLQS(&b, nil)
	if b.Len() != 0 {
		t.Errorf("no runs, yet: %q", b.String())
	}
}
