package main

import (
	"context"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	rng := rand.New(rand.NewPCG(1, 2))
	var values []time.Duration
	for range 100_000 {
		// Log-uniform from 1 µs to 100 ms, as latencies spread.
		v := time.Duration(float64(time.Microsecond) * math.Pow(1e5, rng.Float64()))
		values = append(values, v)
		h.Record(v)
	}
	slices.Sort(values)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		want := values[min(len(values)-1, int(q*float64(len(values))))]
		got := h.Quantile(q)
		if rel := float64(got-want) / float64(want); rel > 0.02 || rel < -0.02 {
			t.Errorf("q%v: %v, want %v within 2%%", q, got, want)
		}
	}
	if h.Count() != 100_000 {
		t.Errorf("count %d", h.Count())
	}
}

func TestHistogramBuckets(t *testing.T) {
	for _, v := range []time.Duration{0, 1, 63, 64, 65, 127, 128, 1000, time.Millisecond, time.Hour, 1<<63 - 1} {
		i := bucketOf(v)
		if i < 0 || i >= histBuckets {
			t.Fatalf("%d: bucket %d out of range", v, i)
		}
		mid := bucketValue(i)
		if v >= linear {
			if rel := float64(mid-v) / float64(v); rel > 0.032 || rel < -0.032 {
				t.Errorf("%d: bucket middle %d", v, mid)
			}
		} else if mid != v {
			t.Errorf("%d: bucket value %d", v, mid)
		}
		if i > 0 && bucketOf(v) < bucketOf(v-1) {
			t.Errorf("%d: buckets not monotonic", v)
		}
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 {
		t.Error("empty histogram")
	}
}

func TestScenarios(t *testing.T) {
	all := allScenarios()
	if want := len(shapes) * (1 + 2*len(algorithms)); len(all) != want {
		t.Fatalf("%d scenarios, want %d", len(all), want)
	}
	names := map[string]bool{}
	for i, s := range all {
		if names[s.Name()] {
			t.Fatalf("duplicate %s", s.Name())
		}
		names[s.Name()] = true
		// Each scenario's floor runs before it.
		if !s.Floor() && !slices.Contains(all[:i], s.FloorOf()) {
			t.Errorf("%s runs before its floor %s", s.Name(), s.FloorOf().Name())
		}
	}
	for _, alg := range algorithms {
		for _, keys := range []string{"hot", "10k"} {
			for _, mode := range []string{"allowed", "denied"} {
				for _, c := range []string{"c50", "c200"} {
					if name := alg.Name + "/" + keys + "/" + mode + "/1d/" + c; !names[name] {
						t.Errorf("the full matrix lacks %s", name)
					}
				}
			}
		}
	}
	quick := quickScenarios()
	for _, s := range quick {
		if !names[s.Name()] {
			t.Errorf("quick scenario %s is not in the full matrix", s.Name())
		}
	}
	for _, alg := range algorithms {
		if !slices.Contains(quick, Scenario{Alg: alg.Name, Keys: 1, Descriptors: 1, Concurrency: 200}) {
			t.Errorf("-quick lacks %s", alg.Name)
		}
	}

	got, err := selectScenarios(false, "^log/hot/.*/1d/c200$", true)
	if err != nil {
		t.Fatal(err)
	}
	var gotNames []string
	for _, s := range got {
		gotNames = append(gotNames, s.Name())
	}
	if want := "floor/hot/1d/c200 log/hot/allowed/1d/c200 log/hot/denied/1d/c200"; strings.Join(gotNames, " ") != want {
		t.Errorf("-run with floors: %v, want %s", gotNames, want)
	}
	if got, err := selectScenarios(false, "/c50$", false); err != nil || len(got) != 2*2*len(algorithms) || slices.ContainsFunc(got, Scenario.Floor) {
		t.Errorf("-run -floor=false: %v, %v", got, err)
	}
	if got, err := selectScenarios(true, "", false); err != nil || len(got) != len(quick)-2 {
		t.Errorf("-quick -floor=false: %v, %v", got, err)
	}
	if got, err := selectScenarios(true, "nothing", true); err != nil || len(got) != 0 {
		t.Errorf("-run matching nothing: %v, %v; want none (run checks that bursts match instead)", got, err)
	}
	var stderr strings.Builder
	code := run(context.Background(), []string{"-run", "nothing"}, io.Discard, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "matches no scenario, RLQS run, burst or seats run") {
		t.Errorf("-run matching nothing: exit %d, %q", code, stderr.String())
	}
}

func TestRequests(t *testing.T) {
	reqs := requests(Scenario{Alg: "log", Keys: keyspace10k, Denied: true, Descriptors: 3, Concurrency: 50})
	if len(reqs) != keyspace10k {
		t.Fatalf("%d requests", len(reqs))
	}
	for _, r := range reqs {
		seen := map[string]bool{}
		for _, d := range r.Descriptors {
			e := d.Entries[0]
			if e.Key != "log_denied" || seen[e.Value] {
				t.Fatalf("request %v: descriptors must be distinct counters of the rule", r)
			}
			seen[e.Value] = true
		}
	}
	if hot := requests(Scenario{Alg: "fixed", Keys: 1, Descriptors: 1, Concurrency: 50}); len(hot) != 1 || hot[0].Descriptors[0].Entries[0].Value != "0" {
		t.Fatalf("hot key: %v", hot)
	}
}

// TestBenchConfig checks that bench.yaml has both rules of every algorithm
// the bench measures, with that algorithm: a far-away limit and one per
// minute.
func TestBenchConfig(t *testing.T) {
	cfg, err := config.Load("../../bench/config/bench.yaml", config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range algorithms {
		for _, denied := range []bool{false, true} {
			s := Scenario{Alg: alg.Name, Denied: denied}
			rule := config.Match(cfg, domain, []*rlcommon.RateLimitDescriptor_Entry{{Key: s.RuleKey(), Value: "0"}})
			if rule == nil || rule.Unlimited {
				t.Fatalf("bench.yaml has no limited rule for %s", s.RuleKey())
			}
			if rule.Algorithm.String() != alg.Config {
				t.Errorf("%s: algorithm %s, want %s", s.RuleKey(), rule.Algorithm, alg.Config)
			}
			if denied && rule.RequestsPerUnit != 1 || !denied && rule.RequestsPerUnit < 10_000 {
				t.Errorf("%s: limit %d", s.RuleKey(), rule.RequestsPerUnit)
			}
		}
	}
}

// callCount counts the calls a test's Call makes, and lets the test wait
// for more of them.
type callCount struct {
	mu   sync.Mutex
	n    int64
	more chan struct{} // closed, and replaced, at each call
}

func newCallCount() *callCount { return &callCount{more: make(chan struct{})} }

// add counts a call and returns the count.
func (c *callCount) add() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	close(c.more)
	c.more = make(chan struct{})
	return c.n
}

func (c *callCount) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = 0
}

// await waits until k more calls than now have been made.
func (c *callCount) await(t *testing.T, k int64) {
	t.Helper()
	c.mu.Lock()
	target := c.n + k
	c.mu.Unlock()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		n, more := c.n, c.more
		c.mu.Unlock()
		if n >= target {
			return
		}
		select {
		case <-more:
		case <-deadline.C:
			t.Fatalf("%d calls of %d within a minute", n-(target-k), k)
		}
	}
}

// TestRun drives a Run with calls that answer at once: what it counts, and
// how a deadline is applied, enforced or not.
func TestRun(t *testing.T) {
	n := newCallCount()
	call := func(int) Call {
		return func(ctx context.Context, _ *rand.Rand) (uint64, uint64, string) {
			if _, ok := ctx.Deadline(); !ok {
				return 0, 0, "NoDeadline"
			}
			if n.add()%4 == 0 {
				return 0, 0, "Unavailable"
			}
			return 2, 1, ""
		}
	}
	r := Start(3, Deadline{D: time.Hour, Enforce: true}, 0, call)
	r.Measure()
	n.await(t, 100)
	res := r.Stop()
	if res.Requests == 0 || res.Decisions != 2*res.Requests || res.OverLimit != res.Requests {
		t.Errorf("counts: %+v", res)
	}
	if res.Errors["Unavailable"] == 0 || res.Errors["NoDeadline"] != 0 || res.Late != 0 {
		t.Errorf("errors: %v, late %d", res.Errors, res.Late)
	}
	if res.Latency.Count() != res.Requests+res.ErrorCount() || res.OtherErrors() != res.Errors["Unavailable"] {
		t.Errorf("every call's latency is recorded: %d of %d", res.Latency.Count(), res.Requests+res.ErrorCount())
	}

	// Not enforced: no deadline on the call, answers later than it are late.
	plain := func(int) Call {
		return func(ctx context.Context, _ *rand.Rand) (uint64, uint64, string) {
			if _, ok := ctx.Deadline(); ok {
				return 0, 0, deadlineExceeded
			}
			n.add()
			return 1, 0, ""
		}
	}
	n.reset()
	r = Start(2, Deadline{D: -1, Enforce: false}, 0, plain)
	r.Measure()
	n.await(t, 100)
	res = r.Stop()
	if res.ErrorCount() != 0 || res.Requests == 0 || res.Late != res.Requests || res.DeadlineMisses() != res.Late {
		t.Errorf("unenforced deadline: %+v", res)
	}

	// A deadline that passes: DeadlineExceeded is a miss, not an "other" error.
	expire := func(int) Call {
		return func(ctx context.Context, _ *rand.Rand) (uint64, uint64, string) {
			<-ctx.Done()
			n.add()
			return 0, 0, deadlineExceeded
		}
	}
	n.reset()
	r = Start(2, Deadline{D: time.Microsecond, Enforce: true}, 0, expire)
	r.Measure()
	n.await(t, 10)
	res = r.Stop()
	if res.DeadlineMisses() == 0 || res.OtherErrors() != 0 || res.ErrorSummary() != "0" {
		t.Errorf("missed deadlines: %+v, summary %q", res, res.ErrorSummary())
	}
}

// TestFloorCaller checks the floor's Redis commands: INCRBY and EXPIRE of
// one counter per descriptor, named after its window.
func TestFloorCaller(t *testing.T) {
	m := miniredis.RunT(t)
	f := newFloorClient(m.Addr(), 2)
	defer f.Close()
	call := f.caller(Scenario{Alg: floorAlg, Keys: 1, Descriptors: 3, Concurrency: 1})(0)
	for range 2 {
		if d, over, code := call(context.Background(), rand.New(rand.NewPCG(1, 2))); d != 3 || over != 0 || code != "" {
			t.Fatalf("call: %d %d %q", d, over, code)
		}
	}
	keys := m.Keys()
	if len(keys) != 3 {
		t.Fatalf("keys %v, want one per descriptor", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "floor_") {
			t.Errorf("key %s", k)
		}
		if v, _ := m.Get(k); v != "2" {
			t.Errorf("%s = %s, want 2", k, v)
		}
		if ttl := m.TTL(k); ttl != floorWindow {
			t.Errorf("%s TTL %v", k, ttl)
		}
	}
	m.Close()
	if _, _, code := call(context.Background(), rand.New(rand.NewPCG(1, 2))); code != "RedisConnection" {
		t.Errorf("Redis down: %q", code)
	}
}

func TestServiceEnv(t *testing.T) {
	got := serviceEnv([]string{"PATH=/bin", "RATELIMIT_STORE_TIMEOUT=1s", "GOGC=50", "GOMAXPROCS=1", "HOME=/h"}, []string{"GOGC=400"})
	if want := "PATH=/bin HOME=/h GOGC=400"; strings.Join(got, " ") != want {
		t.Errorf("serviceEnv: %v, want %s", got, want)
	}
}

func TestParsers(t *testing.T) {
	// A command name with spaces and parentheses.
	d, err := parseStat("1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0", 100)
	if err != nil || d != 3*time.Second {
		t.Errorf("parseStat: %v, %v", d, err)
	}
	got, err := parseCounters(strings.NewReader(`# HELP ratelimit_store_errors_total x
ratelimit_store_errors_total{kind="timeout"} 3
ratelimit_store_errors_total{kind="connection"} 2
ratelimit_requests_shed_total 7
ratelimit_decisions_total{domain="bench",rule="log",outcome="over_limit"} 1e+06
ratelimit_decisions_total{domain="bench",rule="log",outcome="failure_allow"} 4
ratelimit_decisions_total{domain="bench",rule="a \"quoted\" rule, {x}",outcome="failure_allow"} 1
ratelimit_decisions_total{domain="bench",rule="fixed",outcome="failure_deny"} 2 1700000000000
go_goroutines 12
`))
	want := map[string]float64{"store:timeout": 3, "store:connection": 2, "shed": 7, "failure_allow": 5, "failure_deny": 2}
	if err != nil || !maps.Equal(got, want) {
		t.Errorf("parseCounters: %v, %v, want %v", got, err, want)
	}
	if _, err := parseCounters(strings.NewReader("ratelimit_decisions_total{outcome=\"x} 1\n")); err == nil {
		t.Error("parseCounters accepted an unterminated label")
	}
	if got := count(1234567.4); got != "1,234,567" {
		t.Errorf("count: %s", got)
	}
}

// TestReport checks that a scenario with failure-mode answers, errors or
// missed deadlines is marked, and the ratio to the floor.
func TestReport(t *testing.T) {
	floor := &Measurement{Scenario: Scenario{Alg: floorAlg, Keys: 1, Descriptors: 1, Concurrency: 200},
		Result: Result{Requests: 1000, Decisions: 1000, Errors: map[string]uint64{}}, Elapsed: time.Second,
		RedisCPU: 5 * time.Millisecond}
	clean := &Measurement{Scenario: Scenario{Alg: "log", Keys: 1, Descriptors: 1, Concurrency: 200},
		Result: Result{Requests: 1000, Decisions: 1000, Errors: map[string]uint64{}}, Elapsed: time.Second,
		RedisCPU: 10 * time.Millisecond, Counters: map[string]float64{}}
	failing := &Measurement{Scenario: Scenario{Alg: "fixed", Keys: 1, Denied: true, Descriptors: 1, Concurrency: 200},
		Result:  Result{Requests: 990, Decisions: 990, Errors: map[string]uint64{deadlineExceeded: 10, "Unavailable": 2}},
		Elapsed: time.Second, RedisCPU: 15 * time.Millisecond,
		Counters: map[string]float64{"failure_allow": 7, "store:timeout": 6, "store:canceled": 1}}
	if clean.failed() || !failing.failed() || floor.failed() {
		t.Errorf("failed: %v %v %v", clean.failed(), failing.failed(), floor.failed())
	}
	if got := failing.failureSummary(); got != "allow 7 (store: canceled 1, timeout 6)" {
		t.Errorf("failureSummary %q", got)
	}
	if got := failing.misses(); got != "10 (1.0%)" {
		t.Errorf("misses %q", got)
	}
	var b strings.Builder
	writeMarkdown(&b, &Report{Options: options{timeout: 20 * time.Millisecond, conns: 4, floorConns: 10},
		ServiceArgs: []string{"--config", "x"}, Measurements: []*Measurement{floor, clean, failing}})
	out := b.String()
	reportHas(t, out,
		"|  | log/hot/allowed/1d/c200 |",
		"| ! | fixed/hot/denied/1d/c200 |",
		"| 2.0x |", "| 3.0x |",
		"**1 of 3 scenarios (!) had failure-mode answers, store errors, gRPC errors or missed deadlines (20ms):** fixed/hot/denied/1d/c200.",
		"| sliding_window_log | 2.0x | - |",
		"| fixed_window | - | 3.0x |",
		"| floor: Redis CPU / decision | 5.0 µs | 5.0 µs |",
	)
}

// reportHas fails t for each of wants that out lacks.
func reportHas(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestBurstReport checks what a burst lets through (OK plus errors), the
// bound it is held to, and that a burst past the bound is marked.
func TestBurstReport(t *testing.T) {
	within := &BurstResult{Alg: "log", Round: 1, Admitted: 1, Denied: 1979, Errors: map[string]int{"DeadlineExceeded": 20}}
	over := &BurstResult{Alg: "fixed", Round: 2, Admitted: 1, Denied: 1978, Errors: map[string]int{"DeadlineExceeded": 20, "Unavailable": 1}}
	for _, tc := range []struct {
		b        *BurstResult
		through  int
		overMark bool
	}{{within, 21, false}, {over, 22, true}} {
		if got := tc.b.LetThrough(); got != tc.through || tc.b.Over() != tc.overMark {
			t.Errorf("%s burst %d: let through %d, over %v; want %d, %v", tc.b.Alg, tc.b.Round, got, tc.b.Over(), tc.through, tc.overMark)
		}
	}
	var b strings.Builder
	writeBursts(&b, options{timeout: 20 * time.Millisecond}, []*BurstResult{within, over})
	out := b.String()
	reportHas(t, out,
		"|  | log | 1 | 1 | 1979 | DeadlineExceeded 20 | 21 |",
		"| ! | fixed | 2 | 1 | 1978 | DeadlineExceeded 20, Unavailable 1 | 22 |",
		"**1 of 2 bursts (!) let more than 21 through:** fixed burst 2.",
	)
	if algs, err := selectBursts(3, "burst/(log|fixed)"); err != nil || len(algs) != 2 {
		t.Errorf("selectBursts: %v, %v", algs, err)
	}
	if algs, _ := selectBursts(0, ""); len(algs) != 0 {
		t.Errorf("selectBursts with 0 rounds: %v", algs)
	}
}

// nameList is the names of items, space-separated.
func nameList[T interface{ Name() string }](items []T) string {
	var out []string
	for _, it := range items {
		out = append(out, it.Name())
	}
	return strings.Join(out, " ")
}

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

// TestSkewScenarios checks the skewed-keys scenarios' names and what each
// selection runs: a service scenario brings its floor and
// envoyproxy/ratelimit's before it, unless -floor=false or
// -envoyproxy=false; -quick runs zipf alone.
func TestSkewScenarios(t *testing.T) {
	names := nameList[Scenario]
	for _, tc := range []struct {
		quick, floors, upstreams bool
		run, want                string
	}{
		{false, true, true, "", "zipf/floor/1d/c64 zipf/envoyproxy/1d/c64 zipf/service/1d/c64 " +
			"uniform/floor/1d/c64 uniform/envoyproxy/1d/c64 uniform/service/1d/c64"},
		{true, true, true, "", "zipf/floor/1d/c64 zipf/envoyproxy/1d/c64 zipf/service/1d/c64"},
		{false, true, true, "zipf|uniform", "zipf/floor/1d/c64 zipf/envoyproxy/1d/c64 zipf/service/1d/c64 " +
			"uniform/floor/1d/c64 uniform/envoyproxy/1d/c64 uniform/service/1d/c64"},
		{false, true, true, "^uniform/service", "uniform/floor/1d/c64 uniform/envoyproxy/1d/c64 uniform/service/1d/c64"},
		{false, false, true, "^zipf/", "zipf/envoyproxy/1d/c64 zipf/service/1d/c64"},
		{false, true, false, "^zipf/", "zipf/floor/1d/c64 zipf/service/1d/c64"},
		{false, true, true, "envoyproxy", "zipf/envoyproxy/1d/c64 uniform/envoyproxy/1d/c64"},
		{false, true, true, "^log/", ""},
	} {
		got, err := selectSkew(tc.quick, tc.run, tc.floors, tc.upstreams)
		if err != nil || names(got) != tc.want {
			t.Errorf("selectSkew(%v, %q, floors %v, envoyproxy %v): %q, %v; want %q",
				tc.quick, tc.run, tc.floors, tc.upstreams, names(got), err, tc.want)
		}
	}
	if _, err := selectSkew(false, "(", true, true); err == nil {
		t.Error("selectSkew accepted a bad regexp")
	}
	// The matrix's selections leave them out.
	if got, _ := selectScenarios(false, "zipf|uniform", true); len(got) != 0 {
		t.Errorf("the matrix has skewed-keys scenarios: %v", got)
	}
	for _, s := range skewScenarios(false) {
		if s.RuleKey() != skewRuleKey || s.Concurrency != skewStreams || s.Descriptors != 1 {
			t.Errorf("%s: rule %s, %d streams, %d descriptors", s.Name(), s.RuleKey(), s.Concurrency, s.Descriptors)
		}
		if f := s.FloorOf(); f.Dist != s.Dist || f.Keys != s.Keys || !f.Floor() {
			t.Errorf("%s: floor %s", s.Name(), f.Name())
		}
		if u := s.UpstreamOf(); u.Dist != s.Dist || u.Keys != s.Keys || !u.Upstream() {
			t.Errorf("%s: envoyproxy/ratelimit's %s", s.Name(), u.Name())
		}
	}
	var stdout strings.Builder
	if code := run(context.Background(), []string{"-list", "-run", "zipf"}, &stdout, io.Discard); code != 0 ||
		stdout.String() != "zipf/floor/1d/c64\nzipf/envoyproxy/1d/c64\nzipf/service/1d/c64\n" {
		t.Errorf("-list -run zipf: exit %d, %q", code, stdout.String())
	}
}

// zipfWant is the share of zipf's draws of the ranks lo..hi (1-based,
// inclusive): sum r^-s over them divided by sum r^-s over every rank.
func zipfWant(lo, hi int) float64 {
	var part, all float64
	for r := 1; r <= zipfKeys; r++ {
		p := math.Pow(float64(r), -zipfS)
		all += p
		if r >= lo && r <= hi {
			part += p
		}
	}
	return part / all
}

// TestZipfSampler checks the ranks zipf draws: within the keys, rank 1
// about 19.6% of the draws, rank 1 about 2^1.2 times as often as rank 2,
// the hot and cold classes their shares, each draw classed by its rank;
// and a worker's sequence is its own and repeatable.
func TestZipfSampler(t *testing.T) {
	s := skewScenarios(false)[0]
	if s.Dist != distZipf || s.Keys != zipfKeys {
		t.Fatalf("first skewed-keys scenario %s", s.Name())
	}
	const n = 400_000
	draw := sampler(s, 3)
	counts := map[int]int{}
	var hot, cold int
	for range n {
		i, class := draw(nil) // zipf draws from its own generator, not the worker's
		if i < 0 || i >= zipfKeys {
			t.Fatalf("draw %d out of 0..%d", i, zipfKeys-1)
		}
		if want := zipfClass(i); class != want {
			t.Fatalf("draw %d: class %d, want %d", i, class, want)
		}
		counts[i]++
		switch class {
		case classHot:
			hot++
		case classCold:
			cold++
		}
	}
	share := func(c int) float64 { return float64(c) / n }
	for _, tc := range []struct {
		what      string
		got, want float64
	}{
		{"rank 1", share(counts[0]), zipfWant(1, 1)},
		{"hot ranks 1-10", share(hot), zipfWant(1, hotRanks)},
		{"cold ranks above 1000", share(cold), zipfWant(coldRank+1, zipfKeys)},
	} {
		if math.Abs(tc.got-tc.want) > 0.005 {
			t.Errorf("%s: %.4f of the draws, want %.4f", tc.what, tc.got, tc.want)
		}
	}
	if got := zipfWant(1, 1); got < 0.19 || got > 0.20 {
		t.Errorf("rank 1's share %.4f, want about 19.6%%", got)
	}
	if r, want := float64(counts[0])/float64(counts[1]), math.Pow(2, zipfS); math.Abs(r-want) > 0.05*want {
		t.Errorf("rank 1 / rank 2: %.3f, want %.3f", r, want)
	}
	if len(counts) < 10_000 {
		t.Errorf("only %d distinct values in %d draws", len(counts), n)
	}
	a, b, again := sampler(s, 1), sampler(s, 2), sampler(s, 1)
	var differ int
	for range 1000 {
		x, _ := a(nil)
		y, _ := b(nil)
		z, _ := again(nil)
		if x != z {
			t.Fatal("worker 1's sequence is not repeatable")
		}
		if x != y {
			differ++
		}
	}
	if differ == 0 {
		t.Error("workers 1 and 2 draw the same sequence")
	}

	u := skewScenarios(false)[3]
	if u.Dist != distUniform || u.Keys != uniformKeys {
		t.Fatalf("fourth skewed-keys scenario %s", u.Name())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	drawU := sampler(u, 0)
	seen := map[int]bool{}
	for range 100_000 {
		i, class := drawU(rng)
		if i < 0 || i >= uniformKeys || class != classNone {
			t.Fatalf("uniform draw %d, class %d", i, class)
		}
		seen[i] = true
	}
	if len(seen) < uniformKeys*99/100 {
		t.Errorf("uniform: %d distinct values of %d in 100,000 draws", len(seen), uniformKeys)
	}
}

func TestSkewRequests(t *testing.T) {
	reqs := skewRequests(zipfKeys)
	if len(reqs) != zipfKeys {
		t.Fatalf("%d requests", len(reqs))
	}
	for _, i := range []int{0, 9, 99_999} {
		r := reqs[i]
		if r.Domain != domain || len(r.Descriptors) != 1 || len(r.Descriptors[0].Entries) != 1 {
			t.Fatalf("request %d: %v", i, r)
		}
		if e := r.Descriptors[0].Entries[0]; e.Key != skewRuleKey || e.Value != strconv.Itoa(i) {
			t.Errorf("request %d asks for %s=%s", i, e.Key, e.Value)
		}
	}
}

// TestSkewConfig checks the skewed-keys rule: in bench.yaml it names no
// algorithm (it follows the default it is loaded with), loads under the
// service's shipped default, and has the unit and limit that
// envoyproxy/ratelimit's file gets; its limit is far above the hottest
// key's share of any load two cores make. envoyproxy/ratelimit's file has
// only keys the reference reads, and the same rule.
func TestSkewConfig(t *testing.T) {
	var s settings.Settings
	shipped, err := config.ParseAlgorithm(settings.NewFlagSet("ratelimit", &s, io.Discard).Lookup(settings.FlagDefaultAlgorithm).DefValue)
	if err != nil {
		t.Fatal(err)
	}
	entry := []*rlcommon.RateLimitDescriptor_Entry{{Key: skewRuleKey, Value: "0"}}
	for _, def := range []config.Algorithm{shipped, config.FixedWindow, config.GCRA} {
		cfg, err := config.Load("../../bench/config/bench.yaml", config.Defaults{Algorithm: def})
		if err != nil {
			t.Fatalf("bench.yaml under the default %s: %v", def, err)
		}
		rule := config.Match(cfg, domain, entry)
		if rule == nil || rule.Unlimited {
			t.Fatalf("bench.yaml has no limited rule for %s", skewRuleKey)
		}
		if rule.Algorithm != def {
			t.Errorf("%s names an algorithm (%s under the default %s): it must take the service's default", skewRuleKey, rule.Algorithm, def)
		}
		if rule.RequestsPerUnit != skewLimit || !strings.EqualFold(rule.Unit.String(), skewUnit) {
			t.Errorf("%s: %d per %s, want %d per %s as envoyproxy/ratelimit's file", skewRuleKey, rule.RequestsPerUnit, rule.Unit, skewLimit, skewUnit)
		}
		// The hottest key, 19.6% of a million decisions a second (far more
		// than two cores make), stays under the limit.
		if perSecond := float64(rule.RequestsPerUnit) / rule.Unit.Duration().Seconds(); perSecond < zipfWant(1, 1)*1e6 {
			t.Errorf("%s admits %.0f/s", skewRuleKey, perSecond)
		}
	}

	text := upstreamConfig()
	var doc any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatal(err)
	}
	// The keys envoyproxy/ratelimit accepts (its config_impl.go's validKeys, in part).
	valid := map[string]bool{"domain": true, "descriptors": true, "key": true, "value": true, "rate_limit": true, "unit": true, "requests_per_unit": true}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if !valid[k] {
					t.Errorf("envoyproxy/ratelimit's file has the key %q, which it refuses:\n%s", k, text)
				}
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	path := t.TempDir() + "/bench.yaml"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, config.Defaults{Algorithm: config.ReferenceFixedWindow})
	if err != nil {
		t.Fatalf("envoyproxy/ratelimit's file: %v\n%s", err, text)
	}
	if rule := config.Match(cfg, domain, entry); rule == nil || rule.RequestsPerUnit != skewLimit || !strings.EqualFold(rule.Unit.String(), skewUnit) {
		t.Errorf("envoyproxy/ratelimit's file: rule %+v\n%s", rule, text)
	}
}

// TestUpstreamEnv checks envoyproxy/ratelimit's environment: its config
// root, Redis over TCP as host:port, no statsd, its ports, its listeners on
// loopback, and nothing else; and that launch gives a process that
// environment alone.
func TestUpstreamEnv(t *testing.T) {
	env := upstreamEnv("/tmp/root", "127.0.0.1:6379", "1001", "1002", "1003")
	want := map[string]string{
		"RUNTIME_ROOT": "/tmp/root", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:6379",
		"HOST": "127.0.0.1", "PORT": "1001", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "1002", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "1003",
	}
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Errorf("%s set twice", k)
		}
		got[k] = v
	}
	if !maps.Equal(got, want) {
		t.Errorf("upstreamEnv: %v, want %v", got, want)
	}

	if upstreamStatsNote(env) == "" {
		t.Error("the bench's environment for envoyproxy/ratelimit has its stats logged: the report must say so")
	}
	for _, extra := range []string{"DISABLE_STATS=true", "USE_PROMETHEUS=1", "USE_STATSD=true"} {
		over := withEnv(env, []string{extra})
		if note := upstreamStatsNote(over); note != "" {
			t.Errorf("with %s: %q", extra, note)
		}
	}
	if got := withEnv([]string{"A=1", "B=2"}, []string{"B=3", "C=4", "AB=5"}); strings.Join(got, " ") != "A=1 B=3 C=4 AB=5" {
		t.Errorf("withEnv: %v", got)
	}

	envBin, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env command")
	}
	t.Setenv("RATELIMIT_BENCH_TEST_LEAK", "1")
	log := t.TempDir() + "/env.log"
	p, err := launch("env", log, []string{"A=1", "B=2"}, envBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-p.exited; err != nil {
		t.Fatal(err)
	}
	if out := tail(log, 1000); out != "A=1\nB=2\n" {
		t.Errorf("launched with %q, want A and B alone", out)
	}
}

func TestLastLines(t *testing.T) {
	if got := lastLines("a\n\nb\r\nc\nd\n", 3); got != "b; c; d" {
		t.Errorf("lastLines: %q", got)
	}
	if got := lastLines("only", 5); got != "only" {
		t.Errorf("lastLines: %q", got)
	}
}

// TestClassedRun checks that a classed call's latency goes to its class's
// histogram as well as the run's.
func TestClassedRun(t *testing.T) {
	n := newCallCount()
	call := func(int) ClassedCall {
		return func(context.Context, *rand.Rand) (uint64, uint64, string, Class) {
			switch n.add() % 4 {
			case 0:
				return 0, 0, "Unavailable", classHot
			case 1:
				return 1, 0, "", classHot
			case 2:
				return 1, 0, "", classCold
			default:
				return 1, 0, "", classNone
			}
		}
	}
	r := StartClassed(2, Deadline{D: time.Hour, Enforce: true}, 0, call)
	r.Measure()
	n.await(t, 200)
	res := r.Stop()
	if res.Hot.Count() == 0 || res.Cold.Count() == 0 || res.Hot.Count()+res.Cold.Count() >= res.Latency.Count() {
		t.Errorf("hot %d, cold %d of %d calls", res.Hot.Count(), res.Cold.Count(), res.Latency.Count())
	}
	if res.Errors["Unavailable"] == 0 || res.Hot.Count() < res.Errors["Unavailable"] {
		t.Errorf("failed calls of a class count in its histogram: hot %d, errors %v", res.Hot.Count(), res.Errors)
	}
	r = Start(1, Deadline{D: time.Hour, Enforce: true}, 0, func(int) Call {
		return func(context.Context, *rand.Rand) (uint64, uint64, string) { n.add(); return 1, 0, "" }
	})
	r.Measure()
	n.await(t, 10)
	if res := r.Stop(); res.Hot.Count() != 0 || res.Cold.Count() != 0 || res.Latency.Count() == 0 {
		t.Errorf("an unclassed run: hot %d, cold %d of %d", res.Hot.Count(), res.Cold.Count(), res.Latency.Count())
	}
}

// TestFloorSkewCaller checks the floor's counters of a skewed-keys
// scenario: one per drawn value, named after it and the window.
func TestFloorSkewCaller(t *testing.T) {
	m := miniredis.RunT(t)
	f := newFloorClient(m.Addr(), 2)
	defer f.Close()
	s := skewScenarios(false)[0].FloorOf()
	call := f.skewCaller(s)(0)
	hot := 0
	for range 50 {
		d, over, code, class := call(context.Background(), nil)
		if d != 1 || over != 0 || code != "" {
			t.Fatalf("call: %d %d %q", d, over, code)
		}
		if class == classHot {
			hot++
		}
	}
	keys := m.Keys()
	if len(keys) == 0 || len(keys) > 50 || hot == 0 {
		t.Fatalf("keys %v, %d hot calls", keys, hot)
	}
	var sum int
	for _, k := range keys {
		parts := strings.Split(k, "_")
		if len(parts) != 3 || parts[0] != "floor" {
			t.Fatalf("key %s", k)
		}
		if i, err := strconv.Atoi(parts[1]); err != nil || i < 0 || i >= zipfKeys {
			t.Errorf("key %s: value out of the keys", k)
		}
		v, _ := m.Get(k)
		c, _ := strconv.Atoi(v)
		sum += c
	}
	if sum != 50 {
		t.Errorf("counters sum to %d, want 50", sum)
	}
}

// TestSkewReport checks the skewed-keys tables: commands per decision, the
// service over envoyproxy/ratelimit and over the floor, the hot and cold
// keys, marks; and that a reference that could not be built is said.
func TestSkewReport(t *testing.T) {
	zipf := skewScenarios(false)[:3] // floor, envoyproxy, service
	hist := func(d time.Duration, n int) Histogram {
		var h Histogram
		for range n {
			h.Record(d)
		}
		return h
	}
	mk := func(s Scenario, decisions uint64, commands int64, redisCPU, svcCPU time.Duration) *Measurement {
		m := &Measurement{Scenario: s, Elapsed: time.Second, Commands: commands, RedisCPU: redisCPU, SvcCPU: svcCPU,
			Counters: map[string]float64{}}
		m.Requests, m.Decisions, m.Errors = decisions, decisions, map[string]uint64{}
		m.Latency, m.Hot, m.Cold = hist(time.Millisecond, int(decisions)), hist(500*time.Microsecond, int(decisions)/2), hist(2*time.Millisecond, int(decisions)/10)
		return m
	}
	floor := mk(zipf[0], 1000, 2000, 8*time.Millisecond, 0)
	up := mk(zipf[1], 1000, 2000, 10*time.Millisecond, 40*time.Millisecond)
	svc := mk(zipf[2], 1000, 500, 5*time.Millisecond, 20*time.Millisecond)
	svc.Errors = map[string]uint64{deadlineExceeded: 3}
	svc.Start = time.Date(2026, 11, 28, 5, 9, 59, 5e8, time.UTC) // its second holds 05:10:00
	var b strings.Builder
	writeSkew(&b, &Report{Options: options{timeout: 20 * time.Millisecond, conns: 4, duration: time.Second, skewWarmup: 20 * time.Second},
		UpstreamEnv: []string{"USE_STATSD=false"}, Skew: []*Measurement{floor, up, svc}})
	out := b.String()
	reportHas(t, out,
		"1s measured after 20s of warm-up each (-skew-warmup",
		"zipf/service/1d/c64 measured across a minute's start",
		"ran with no argument and this environment alone: `USE_STATSD=false`",
		"|  | zipf/floor/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | - | - | - | 8.0 µs | 2.00 | - |",
		"|  | zipf/envoyproxy/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | - | 0% | 40.0 µs | 10.0 µs | 2.00 | 1.2x |",
		"| ! | zipf/service/1d/c64 | 1,000 |",
		"| 20.0 µs | 5.0 µs | 0.50 | 0.62x |",
		"**1 of 3 skewed-keys scenarios (!) had failure-mode answers, store errors, gRPC errors or missed deadlines (20ms):** zipf/service/1d/c64.",
		"| zipf | 0.25x | 0.50x | 0.50x | 0.62x |",
		"| zipf/service/1d/c64 | 50.0% | 0.50 ms | 0.50 ms | 10.0% | 2.02 ms | 2.02 ms | 1.01 ms | 1.01 ms |",
	)

	b.Reset()
	writeSkew(&b, &Report{Options: options{timeout: 20 * time.Millisecond, conns: 4},
		UpstreamErr: "it could not be built: go install x: exit status 1", Skew: []*Measurement{floor, svc}})
	out = b.String()
	reportHas(t, out,
		"**envoyproxy/ratelimit was not measured:** it could not be built: go install x: exit status 1.",
		"| zipf | - | - | - | 0.62x |",
	)
	b.Reset()
	writeSkew(&b, &Report{})
	if b.Len() != 0 {
		t.Errorf("no skewed-keys scenario, yet: %q", b.String())
	}
	if got := ratio(1, 0); got != "-" {
		t.Errorf("ratio over 0: %s", got)
	}
	if got := ratio(3, 2); got != "1.5x" {
		t.Errorf("ratio: %s", got)
	}
}

// TestHoldsMinuteStart: an interval holds a minute's start when it begins
// in one minute and ends in the next.
func TestHoldsMinuteStart(t *testing.T) {
	at := func(h, m, sec, ms int) time.Time { return time.Date(2026, 11, 28, h, m, sec, ms*1e6, time.UTC) }
	for _, tc := range []struct {
		name  string
		start time.Time
		d     time.Duration
		want  bool
	}{
		{"within a minute", at(5, 9, 20, 0), 5 * time.Second, false},
		{"across :00", at(5, 9, 57, 0), 5 * time.Second, true},
		{"ending just before :00", at(5, 9, 54, 999), 5 * time.Second, false},
		{"starting at :00", at(5, 10, 0, 0), 5 * time.Second, false},
		{"across an hour", at(5, 59, 58, 0), 5 * time.Second, true},
	} {
		if got := holdsMinuteStart(tc.start, tc.d); got != tc.want {
			t.Errorf("%s: %t, want %t", tc.name, got, tc.want)
		}
	}
}

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
		"Latency below saturation (issue 42)",
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
