package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/pkg/config"
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
	if len(all) != 48 {
		t.Fatalf("%d scenarios, want 48", len(all))
	}
	names := map[string]bool{}
	for _, s := range all {
		if names[s.Name()] {
			t.Fatalf("duplicate %s", s.Name())
		}
		names[s.Name()] = true
	}
	for _, s := range quickScenarios() {
		if !names[s.Name()] {
			t.Errorf("quick scenario %s is not in the full matrix", s.Name())
		}
	}
	got, err := selectScenarios(false, "^log/hot/.*/c200$")
	if err != nil || len(got) != 4 {
		t.Fatalf("-run: %v, %v", got, err)
	}
	if _, err := selectScenarios(true, "nothing"); err == nil {
		t.Error("a -run matching nothing must fail")
	}
}

func TestRequests(t *testing.T) {
	g := Group{"log", keyspace10k, true}
	reqs := requests(g, 3)
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
	if hot := requests(Group{"fixed", 1, false}, 1); len(hot) != 1 || hot[0].Descriptors[0].Entries[0].Value != "0" {
		t.Fatalf("hot key: %v", hot)
	}
}

// TestBenchConfig checks that bench.yaml has the rule of every group, and
// the script hit the ceiling sends for it.
func TestBenchConfig(t *testing.T) {
	cfg, err := config.Load("../../bench/config/bench.yaml", config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range allScenarios() {
		if _, err := hitOf(cfg, s.Group()); err != nil {
			t.Fatal(err)
		}
	}
	h, err := hitOf(cfg, Group{"log", keyspace10k, false})
	if err != nil {
		t.Fatal(err)
	}
	if h.Key != "rl:{bench|log=__rand_int__}:log:1" || strings.Join(h.Args, " ") != "1 1 10000 1000000 1 0" {
		t.Errorf("log hit %+v", h)
	}
	h, _ = hitOf(cfg, Group{"fixed", 1, true})
	if h.Key != "rl:{bench|fixed_denied=0}:fixed:60" || strings.Join(h.Args, " ") != "1 3 1 60000000 1 0" {
		t.Errorf("fixed denied hit %+v", h)
	}
}

func TestParsers(t *testing.T) {
	// A command name with spaces and parentheses.
	d, err := parseStat("1234 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0", 100)
	if err != nil || d != 3*time.Second {
		t.Errorf("parseStat: %v, %v", d, err)
	}
	rps, lat, err := parseBenchmarkCSV(`"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"EVALSHA abc 1 k:{x|__rand_int__}","41841.00","0.838","0.144","0.591","2.359","4.511","30.831"
`)
	if err != nil || rps != 41841 || lat != [2]string{"0.591", "4.511"} {
		t.Errorf("parseBenchmarkCSV: %v %v %v", rps, lat, err)
	}
	if _, _, err := parseBenchmarkCSV("ERROR\n"); err == nil {
		t.Error("parseBenchmarkCSV accepted no result")
	}
	st := parseCommandStats("# Commandstats\r\ncmdstat_evalsha:calls=3,usec=120,usec_per_call=40.00,rejected_calls=0,failed_calls=1\r\ncmdstat_zadd:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n")
	if st["evalsha"] != (cmdStat{Calls: 3, Failed: 1, Usec: 120 * time.Microsecond}) || st["zadd"].Calls != 2 {
		t.Errorf("parseCommandStats: %v", st)
	}
	storeErrors, shed, err := parseCounters(strings.NewReader(`# HELP ratelimit_store_errors_total x
ratelimit_store_errors_total{kind="timeout"} 3
ratelimit_store_errors_total{kind="connection"} 2
ratelimit_requests_shed_total 7
ratelimit_decisions_total{domain="bench",rule="log",outcome="over_limit"} 1e+06
`))
	if err != nil || storeErrors != 5 || shed != 7 {
		t.Errorf("parseCounters: %v %v %v", storeErrors, shed, err)
	}
	if got := count(1234567.4); got != "1,234,567" {
		t.Errorf("count: %s", got)
	}
}
