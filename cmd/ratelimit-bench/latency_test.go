package main

import (
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// Tests of the latency-below-saturation section (latency.go).

// TestLatencyFlags checks the latency scenarios' flags: their defaults,
// -quick's, a list given, and the values refused.
func TestLatencyFlags(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		rates          string
		warmup, measur time.Duration
	}{
		{nil, "500,1000,2000,5000,8000,10000", 5 * time.Second, 10 * time.Second},
		{[]string{"-quick"}, "1000,5000", 2 * time.Second, 3 * time.Second},
		{[]string{"-quick", "-latency-rates", "300", "-latency-duration", "1s"}, "300", 2 * time.Second, time.Second},
		{[]string{"-latency-rates", " 2000, 700 ", "-latency-warmup", "0s"}, "2000,700", 0, 10 * time.Second},
		{[]string{"-latency-duration", "0"}, "500,1000,2000,5000,8000,10000", 5 * time.Second, 0},
	} {
		o, err := parseFlags(tc.args, io.Discard)
		if err != nil || o.latRates.String() != tc.rates || o.latWarmup != tc.warmup || o.latDur != tc.measur {
			t.Errorf("%q: rates %s, warm-up %v, measured %v, %v; want %s, %v, %v",
				tc.args, o.latRates.String(), o.latWarmup, o.latDur, err, tc.rates, tc.warmup, tc.measur)
		}
	}
	for _, args := range [][]string{
		{"-latency-rates", ""}, {"-latency-rates", "0"}, {"-latency-rates", "1000,-5"}, {"-latency-rates", "1e3"},
		{"-latency-duration", "50ms"}, {"-latency-warmup", "-1s"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	// The scenario's own warm-up, measured time and pace; the others' are untouched.
	o := options{warmup: time.Second, skewWarmup: 20 * time.Second, duration: 5 * time.Second, rate: 7, latWarmup: 4 * time.Second, latDur: 9 * time.Second}
	lat := latencyScenarios([]int{2000}, 20*time.Millisecond)[1]
	for _, tc := range []struct {
		s              Scenario
		warmup, measur time.Duration
		rate           float64
	}{
		{lat, 4 * time.Second, 9 * time.Second, 2000},
		{skewScenarios(false)[2], 20 * time.Second, 5 * time.Second, 7},
		{quickScenarios()[1], time.Second, 5 * time.Second, 7},
	} {
		if w, d, r := o.timing(tc.s); w != tc.warmup || d != tc.measur || r != tc.rate {
			t.Errorf("timing of %s: %v, %v, %v; want %v, %v, %v", tc.s.Name(), w, d, r, tc.warmup, tc.measur, tc.rate)
		}
	}
}

// TestLatencyScenarios checks the latency scenarios' names, workers and
// traffic, what each selection runs (a service scenario brings
// envoyproxy/ratelimit's of its rate, unless -envoyproxy=false), that no
// other selection takes them, and that the service with slices off gets a
// flag the service has, turning its slices off.
func TestLatencyScenarios(t *testing.T) {
	names := nameList[Scenario]
	const d = 20 * time.Millisecond
	for _, tc := range []struct {
		rates     []int
		run       string
		upstreams bool
		want      string
	}{
		{latencyQuickRates, "", true, "latency/1000rps/envoyproxy latency/1000rps/service latency/1000rps/service-noslices " +
			"latency/5000rps/envoyproxy latency/5000rps/service latency/5000rps/service-noslices"},
		{latencyRates, "^latency/1000rps/service$", true, "latency/1000rps/envoyproxy latency/1000rps/service"},
		{latencyRates, "^latency/1000rps/service$", false, "latency/1000rps/service"},
		{latencyQuickRates, "noslices", true, "latency/1000rps/envoyproxy latency/1000rps/service-noslices " +
			"latency/5000rps/envoyproxy latency/5000rps/service-noslices"},
		{latencyRates, "/10000rps/envoyproxy", true, "latency/10000rps/envoyproxy"},
		{latencyRates, "/10000rps/envoyproxy", false, ""},
		{latencyRates, "zipf|uniform|^log/|^rlqs/|^seats/", true, ""},
	} {
		got, err := selectLatency(tc.run, tc.rates, time.Second, d, tc.upstreams)
		if err != nil || names(got) != tc.want {
			t.Errorf("selectLatency(%v, %q, envoyproxy %v): %q, %v; want %q", tc.rates, tc.run, tc.upstreams, names(got), err, tc.want)
		}
	}
	if got, _ := selectLatency("", latencyRates, 0, d, true); len(got) != 0 {
		t.Errorf("-latency-duration 0: %v", got)
	}
	if _, err := selectLatency("(", latencyRates, time.Second, d, true); err == nil {
		t.Error("selectLatency accepted a bad regexp")
	}
	if got, _ := selectSkew(false, "latency", true, true); len(got) != 0 {
		t.Errorf("the skewed keys have latency scenarios: %v", got)
	}
	if got, _ := selectScenarios(false, "latency", true); len(got) != 0 {
		t.Errorf("the matrix has latency scenarios: %v", got)
	}
	all := latencyScenarios(latencyRates, d)
	if len(all) != 3*len(latencyRates) {
		t.Fatalf("%d latency scenarios", len(all))
	}
	uniform := skewScenarios(false)[5]
	for _, s := range all {
		// The uniform skewed-keys scenario's keys, rule and draw, paced.
		if s.Keys != uniform.Keys || s.Dist != uniform.Dist || s.RuleKey() != uniform.RuleKey() || s.Descriptors != 1 {
			t.Errorf("%s: %d keys, %q, rule %s, %d descriptors; want uniform's", s.Name(), s.Keys, s.Dist, s.RuleKey(), s.Descriptors)
		}
		// Enough workers that the rate is offered even if every call runs to its deadline, and room to spare.
		if s.Concurrency < latencyMinWorkers || float64(s.Concurrency) < 2*float64(s.Rate)*d.Seconds() {
			t.Errorf("%s: %d workers", s.Name(), s.Concurrency)
		}
	}
	if w := latencyWorkers(10_000, d); w != 400 {
		t.Errorf("10,000/s with a 20ms deadline: %d workers, want 400", w)
	}
	if w := latencyWorkers(500, d); w != latencyMinWorkers {
		t.Errorf("500/s: %d workers, want %d", w, latencyMinWorkers)
	}
	var stdout strings.Builder
	if code := run(context.Background(), []string{"-list", "-quick", "-run", "^latency/"}, &stdout, io.Discard); code != 0 ||
		stdout.String() != "latency/1000rps/envoyproxy\nlatency/1000rps/service\nlatency/1000rps/service-noslices\n"+
			"latency/5000rps/envoyproxy\nlatency/5000rps/service\nlatency/5000rps/service-noslices\n" {
		t.Errorf("-list -quick -run ^latency/: exit %d, %q", code, stdout.String())
	}

	var s settings.Settings
	fs := settings.NewFlagSet("ratelimit", &s, io.Discard)
	if s.HotKeyThreshold <= 0 {
		t.Fatalf("the shipped --hot-key-threshold is %v: slices are off at the defaults, the service-noslices target compares nothing", s.HotKeyThreshold)
	}
	if err := fs.Parse(noSlicesArgs); err != nil || s.HotKeyThreshold != 0 {
		t.Errorf("the service with %q: threshold %v, %v; want 0 (slices off)", noSlicesArgs, s.HotKeyThreshold, err)
	}
}

// TestLatencyReport checks the latency table: a row per rate and target in
// the order measured, the quantiles, misses and errors, marks; and that the
// report prints the section alone.
func TestLatencyReport(t *testing.T) {
	cells := latencyScenarios([]int{1000}, 20*time.Millisecond)
	mk := func(s Scenario, calls int, lat time.Duration) *Measurement {
		m := &Measurement{Scenario: s, Elapsed: 2 * time.Second, Counters: map[string]float64{}}
		m.Errors = map[string]uint64{}
		for i := range calls {
			d := lat // p50, p99
			switch {
			case i == calls-1:
				d = 10 * lat // the slowest: above p999
			case i >= calls*99/100:
				d = 4 * lat // p999
			}
			m.Latency.Record(d)
		}
		m.Requests, m.Decisions = uint64(calls), uint64(calls)
		return m
	}
	up := mk(cells[0], 1000, time.Millisecond)
	svc := mk(cells[1], 1000, 500*time.Microsecond)
	off := mk(cells[2], 1000, 2*time.Millisecond)
	off.Requests, off.Decisions = 990, 990
	off.Errors = map[string]uint64{deadlineExceeded: 8, "Unavailable": 2}
	off.Counters = map[string]float64{"failure_defer": 2}
	up.Busy = 12*time.Second + 500*time.Millisecond
	var b strings.Builder
	rep := &Report{Options: options{timeout: 20 * time.Millisecond, conns: 4, latWarmup: 5 * time.Second, latDur: 2 * time.Second},
		Latency: []*Measurement{up, svc, off}}
	writeMarkdown(&b, rep)
	out := b.String()
	reportHas(t, out,
		"Latency below saturation: open loop",
		"each cell 5s of warm-up, then 2s measured",
		"with `--hot-key-threshold 0` added",
		"| ! | offered/s | target | workers | achieved/s | p50 | p99 | p999 | deadline misses | errors |",
		"|  | 1,000 | envoyproxy | 64 | 500 | 1.01 ms | 1.01 ms | 4.03 ms | 0 | 0 |",
		"|  | 1,000 | service | 64 | 500 | 0.50 ms | 0.50 ms | 2.02 ms | 0 | 0 |",
		"| ! | 1,000 | service-noslices | 64 | 495 | 2.02 ms | 2.02 ms | 8.06 ms | 8 (0.8%) | Unavailable 2; service: defer 2 |",
		"**1 of 3 latency scenarios (!) had failure-mode answers, store errors, gRPC errors or missed deadlines (20ms):** latency/1000rps/service-noslices.",
		"before the next scenario: latency/1000rps/envoyproxy 12.5s.",
	)
	if i, j := strings.Index(out, "| envoyproxy |"), strings.Index(out, "| service |"); i < 0 || j < i {
		t.Errorf("rows out of the order measured:\n%s", out)
	}
	b.Reset()
	rep.UpstreamErr = "it could not be built: go install x: exit status 1"
	rep.Latency = []*Measurement{svc}
	writeLatency(&b, rep)
	if out := b.String(); !strings.Contains(out, "**envoyproxy/ratelimit was not measured:** it could not be built") ||
		!strings.Contains(out, "No latency scenario had a failure-mode answer") || strings.Contains(out, "busy after") {
		t.Errorf("without envoyproxy/ratelimit:\n%s", out)
	}
	b.Reset()
	writeLatency(&b, &Report{})
	if b.Len() != 0 {
		t.Errorf("no latency scenario, yet: %q", b.String())
	}
}

// TestSettle checks that settle waits while a process is busy, and not
// much longer: here the test's own process, spinning for a second.
func TestSettle(t *testing.T) {
	tick := clockTick()
	var stop atomic.Bool
	var spin sync.WaitGroup
	spin.Go(func() {
		for !stop.Load() {
		}
	})
	time.AfterFunc(time.Second, func() { stop.Store(true) })
	busy, err := settle(context.Background(), 0, tick)
	if err != nil || busy < 500*time.Millisecond || busy > 5*time.Second {
		t.Errorf("spinning for 1s: busy %v, %v", busy, err)
	}
	spin.Wait()
	if busy, err := settle(context.Background(), 0, tick); err != nil || busy > 2*time.Second {
		t.Errorf("idle: busy %v, %v", busy, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := settle(ctx, 0, tick); err == nil {
		t.Error("settle ignored its context")
	}
}
