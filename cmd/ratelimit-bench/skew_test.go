package main

import (
	"context"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

// Tests of the skewed-keys scenarios (skew.go) and envoyproxy/ratelimit beside them (upstream.go).

// TestSkewScenarios checks the skewed-keys scenarios' names and what each
// selection runs: a service scenario brings its floor and
// envoyproxy/ratelimit's before it, unless -floor=false or
// -envoyproxy=false; -quick runs zipf alone.
func TestSkewScenarios(t *testing.T) {
	names := nameList[Scenario]
	// The skewed keys per algorithm and window, per distribution, in run
	// order: envoyproxy/ratelimit per second first, then the service's, each
	// with its slices-off one after it.
	const zipfAlgos = "zipf/envoyproxy/second/1d/c64 " +
		"zipf/service/log-second/1d/c64 zipf/service-noslices/log-second/1d/c64 " +
		"zipf/service/counter-second/1d/c64 zipf/service-noslices/counter-second/1d/c64 " +
		"zipf/service/fixed-second/1d/c64 zipf/service-noslices/fixed-second/1d/c64 " +
		"zipf/service/gcra-second/1d/c64 zipf/service-noslices/gcra-second/1d/c64 " +
		"zipf/service/log-minute/1d/c64 zipf/service-noslices/log-minute/1d/c64 " +
		"zipf/service/counter-minute/1d/c64 zipf/service-noslices/counter-minute/1d/c64 " +
		"zipf/service/fixed-minute/1d/c64 zipf/service-noslices/fixed-minute/1d/c64 " +
		"zipf/service/gcra-minute/1d/c64 zipf/service-noslices/gcra-minute/1d/c64"
	const uniformAlgos = "uniform/envoyproxy/second/1d/c64 " +
		"uniform/service/log-second/1d/c64 uniform/service-noslices/log-second/1d/c64 " +
		"uniform/service/counter-second/1d/c64 uniform/service-noslices/counter-second/1d/c64 " +
		"uniform/service/fixed-second/1d/c64 uniform/service-noslices/fixed-second/1d/c64 " +
		"uniform/service/gcra-second/1d/c64 uniform/service-noslices/gcra-second/1d/c64 " +
		"uniform/service/log-minute/1d/c64 uniform/service-noslices/log-minute/1d/c64 " +
		"uniform/service/counter-minute/1d/c64 uniform/service-noslices/counter-minute/1d/c64 " +
		"uniform/service/fixed-minute/1d/c64 uniform/service-noslices/fixed-minute/1d/c64 " +
		"uniform/service/gcra-minute/1d/c64 uniform/service-noslices/gcra-minute/1d/c64"
	const paced = "paced/service/gcra-second/1d/c400 paced/service-noslices/gcra-second/1d/c400"
	const base = "zipf/floor/1d/c64 zipf/envoyproxy/1d/c64 zipf/service/1d/c64 " +
		"uniform/floor/1d/c64 uniform/envoyproxy/1d/c64 uniform/service/1d/c64"
	for _, tc := range []struct {
		quick, floors, upstreams bool
		run, want                string
	}{
		{false, true, true, "", base + " " + zipfAlgos + " " + uniformAlgos + " " + paced},
		// GCRA at its pace has neither a floor nor envoyproxy/ratelimit.
		{false, true, true, "^paced/", paced},
		{true, true, true, "", "zipf/floor/1d/c64 zipf/envoyproxy/1d/c64 zipf/service/1d/c64"},
		{false, true, true, "^(zipf|uniform)/[^/]+/1d/", base},
		{false, true, true, "^uniform/service/1d", "uniform/floor/1d/c64 uniform/envoyproxy/1d/c64 uniform/service/1d/c64"},
		{false, false, true, "^zipf/[^/]+/1d/", "zipf/envoyproxy/1d/c64 zipf/service/1d/c64"},
		{false, true, false, "^zipf/[^/]+/1d/", "zipf/floor/1d/c64 zipf/service/1d/c64"},
		{false, true, true, "envoyproxy", "zipf/envoyproxy/1d/c64 uniform/envoyproxy/1d/c64 zipf/envoyproxy/second/1d/c64 uniform/envoyproxy/second/1d/c64"},
		// A per-algorithm scenario brings the floor and envoyproxy/ratelimit
		// of its window (per minute, the skewed keys' own), not slices off.
		{false, true, true, "^zipf/service/gcra-second/", "zipf/floor/1d/c64 zipf/envoyproxy/second/1d/c64 zipf/service/gcra-second/1d/c64"},
		{false, false, true, "^uniform/service/fixed-minute/", "uniform/envoyproxy/1d/c64 uniform/service/fixed-minute/1d/c64"},
		{false, false, false, "-noslices/log-second", "zipf/service-noslices/log-second/1d/c64 uniform/service-noslices/log-second/1d/c64"},
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
	if code := run(context.Background(), []string{"-list", "-run", "^zipf/[^/]+/1d/"}, &stdout, io.Discard); code != 0 ||
		stdout.String() != "zipf/floor/1d/c64\nzipf/envoyproxy/1d/c64\nzipf/service/1d/c64\n" {
		t.Errorf("-list -run ^zipf/[^/]+/1d/: exit %d, %q", code, stdout.String())
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
	reqs := skewRequests(skewRuleKey, zipfKeys)
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

// TestSkewAlgoConfig checks the rules of the skewed keys per algorithm and
// window: each service scenario's rule key is a rule of its algorithm and
// window in bench.yaml, its limit far above the hottest key's share (the
// log's at its most, 10,000); envoyproxy/ratelimit's per-second scenario
// asks for a rule of its file, per second, with the service's per-second
// limit.
func TestSkewAlgoConfig(t *testing.T) {
	cfg, err := config.Load("../../bench/config/bench.yaml", config.Defaults{Algorithm: config.SlidingWindowCounter})
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/upstream.yaml"
	if err := os.WriteFile(path, []byte(upstreamConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	upCfg, err := config.Load(path, config.Defaults{Algorithm: config.ReferenceFixedWindow})
	if err != nil {
		t.Fatalf("envoyproxy/ratelimit's file: %v", err)
	}
	configOf := map[string]string{}
	for _, a := range algorithms {
		configOf[a.Name] = a.Config
	}
	var services, upstreams int
	for _, s := range skewAlgoScenarios() {
		entry := []*rlcommon.RateLimitDescriptor_Entry{{Key: s.RuleKey(), Value: "0"}}
		c := cfg
		if s.Upstream() {
			c = upCfg
			upstreams++
		} else {
			services++
		}
		rule := config.Match(c, domain, entry)
		if rule == nil || rule.Unlimited {
			t.Errorf("%s: no limited rule for %s", s.Name(), s.RuleKey())
			continue
		}
		if !strings.EqualFold(rule.Unit.String(), s.Window) {
			t.Errorf("%s: rule %s per %s", s.Name(), s.RuleKey(), rule.Unit)
		}
		want := uint32(skewSecondLimit)
		switch {
		case s.Dist == distPaced:
			want = pacedRate
			if s.Rate != pacedRate || s.Keys != 1 || s.Algo != "gcra" {
				t.Errorf("%s: %d keys at %d a second, %s", s.Name(), s.Keys, s.Rate, s.Algo)
			}
		case s.Algo == "log":
			want = skewLogLimit
		case s.Window == "minute":
			want = skewLimit
		}
		if rule.RequestsPerUnit != want {
			t.Errorf("%s: %s admits %d per %s, want %d", s.Name(), s.RuleKey(), rule.RequestsPerUnit, rule.Unit, want)
		}
		if !s.Upstream() && rule.Algorithm.String() != configOf[s.Algo] {
			t.Errorf("%s: %s is %s", s.Name(), s.RuleKey(), rule.Algorithm)
		}
	}
	// Per distribution: four algorithms by two windows, twice (slices
	// off); envoyproxy/ratelimit per second; GCRA at its pace, twice.
	if services != 16+16+2 || upstreams != 2 {
		t.Errorf("%d service scenarios, %d of envoyproxy/ratelimit", services, upstreams)
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
	// Per algorithm and window: GCRA per second beside envoyproxy/ratelimit
	// per second, and the counter per minute on uniform keys beside slices
	// off and envoyproxy/ratelimit's per-minute row (the skewed keys' own).
	gcraSecond := Scenario{Alg: skewAlg, Keys: zipfKeys, Descriptors: 1, Concurrency: skewStreams, Dist: distZipf, Window: "second", Algo: "gcra"}
	counterMinute := Scenario{Alg: skewAlg, Keys: uniformKeys, Descriptors: 1, Concurrency: skewStreams, Dist: distUniform, Window: "minute", Algo: "counter"}
	upSecond := mk(gcraSecond.UpstreamOf(), 1000, 2000, 10*time.Millisecond, 40*time.Millisecond)
	svcSecond := mk(gcraSecond, 1000, 250, 2*time.Millisecond, 10*time.Millisecond)
	upUniform := mk(skewScenarios(false)[4], 1000, 2000, 10*time.Millisecond, 40*time.Millisecond)
	svcMinute := mk(counterMinute, 1000, 200, 4*time.Millisecond, 20*time.Millisecond)
	offMinute := mk(counterMinute.NoSlicesOf(), 1000, 1000, 8*time.Millisecond, 30*time.Millisecond)
	var b strings.Builder
	writeSkew(&b, &Report{Options: options{timeout: 20 * time.Millisecond, conns: 4, duration: time.Second, skewWarmup: 20 * time.Second},
		UpstreamEnv: []string{"USE_STATSD=false"}, Skew: []*Measurement{floor, up, svc, upSecond, svcSecond, upUniform, svcMinute, offMinute}})
	out := b.String()
	reportHas(t, out,
		"1s measured after 20s of warm-up each (-skew-warmup",
		"zipf/service/1d/c64 measured across a minute's start",
		"ran with no argument and this environment alone: `USE_STATSD=false`",
		"|  | zipf/floor/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | - | - | - | 8.0 µs | 2.00 | - |",
		"|  | zipf/envoyproxy/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | - | 0% | 40.0 µs | 10.0 µs | 2.00 | 1.2x |",
		"| ! | zipf/service/1d/c64 | 1,000 |",
		"| 20.0 µs | 5.0 µs | 0.50 | 0.62x |",
		"**1 of 4 skewed-keys scenarios (!) had failure-mode answers, store errors, gRPC errors or missed deadlines (20ms):** zipf/service/1d/c64.",
		"| zipf | 0.25x | 0.50x | 0.50x | 0.62x |",
		"| zipf/service/1d/c64 | 50.0% | 0.50 ms | 0.50 ms | 10.0% | 2.02 ms | 2.02 ms | 1.01 ms | 1.01 ms |",
		"Skewed keys per algorithm and window: as above (20s of warm-up, 1s measured, 64 streams)",
		"|  | zipf/envoyproxy/second/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | 0% | 40.0 µs | 10.0 µs | 2.00 | - | - | - | - |",
		"|  | zipf/service/gcra-second/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | 0% | 10.0 µs | 2.0 µs | 0.25 | 0.12x | 0.20x | 0.25x | - |",
		"|  | uniform/service/counter-minute/1d/c64 | 1,000 | 1.01 ms | 1.01 ms | 0 | 0 | 0% | 20.0 µs | 4.0 µs | 0.20 | 0.10x | 0.40x | 0.50x | 0.20x |",
		"|  | uniform/service-noslices/counter-minute/1d/c64 | 1,000 |",
	)
	if strings.Contains(out, "| uniform | ") || strings.Contains(out, "gcra-second/1d/c64 | 50.0%") {
		t.Errorf("the per-algorithm scenarios are in the skewed keys' own tables:\n%s", out)
	}

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

// TestCommandMix: the commands per decision, the most called first, those
// under one in a thousand decisions left out.
func TestCommandMix(t *testing.T) {
	mix := map[string]int64{"SET": 2500, "FCALL": 420, "MGET": 420, "TIME": 420, "HSET": 44, "PING": 5}
	want := "SET 0.250, FCALL 0.042, MGET 0.042, TIME 0.042, HSET 0.004"
	if got := commandMix(mix, 10_000); got != want {
		t.Fatalf("commandMix = %q, want %q", got, want)
	}
}
