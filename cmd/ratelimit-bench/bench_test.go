package main

import (
	"context"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
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
	if code != 2 || !strings.Contains(stderr.String(), "matches no scenario, RLQS run, burst, seats or regions run") {
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

func TestLastLines(t *testing.T) {
	if got := lastLines("a\n\nb\r\nc\nd\n", 3); got != "b; c; d" {
		t.Errorf("lastLines: %q", got)
	}
	if got := lastLines("only", 5); got != "only" {
		t.Errorf("lastLines: %q", got)
	}
}
