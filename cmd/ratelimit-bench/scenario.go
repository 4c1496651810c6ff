package main

import (
	"fmt"
	"regexp"
	"strconv"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// domain is the bench config's domain (bench/config/bench.yaml).
const domain = "bench"

// keyspace10k is the number of distinct values of the "10k keys" scenarios.
const keyspace10k = 10_000

// Algorithm is one algorithm the bench measures: Name is its short name in
// scenario names and its rule keys in bench.yaml (Name and Name+"_denied"),
// Config the algorithm those rules name.
type Algorithm struct {
	Name, Config string
}

// algorithms are the algorithms measured, in report order. To measure one
// more, add it here and its two rules to bench/config/bench.yaml (a test
// checks that they are there).
var algorithms = []Algorithm{
	{"log", "sliding_window_log"},
	{"counter", "sliding_window_counter"},
	{"fixed", "fixed_window"},
	{"gcra", "gcra"},
	{"reference", "reference_fixed_window"},
}

// floorAlg is the Alg of the floor scenarios: no service, the bench itself
// sends INCRBY + EXPIRE per decision to the redis-server (see floor.go).
const floorAlg = "floor"

// Scenario is one measured load: which rule (or the floor client), how many
// distinct keys, how many descriptors per request, how many concurrent
// streams. The skewed-keys scenarios (skew.go) have a Dist, the latency
// scenarios (latency.go) a Dist and a Rate.
type Scenario struct {
	Alg         string // an algorithms Name (the rule key in bench.yaml), or floorAlg; with a Dist, skewAlg, upstreamAlg or noSlicesAlg
	Keys        int    // 1 (one hot key) or keyspace10k; with a Dist, the keys it draws from
	Denied      bool   // the *_denied rule (limit 1 per minute) instead of a limit far above the load
	Descriptors int    // descriptors per request, each its own counter
	Concurrency int    // workers, each with one request in flight
	Dist        string // "" (the matrix: one hot key, or uniform over Keys), or distZipf or distUniform (skew.go)
	Rate        int    // 0: closed loop (or -rate); else the requests/s its Concurrency workers are paced to (latency.go, and distPaced)
	// The skewed keys per algorithm and window (skew.go): the rule's unit
	// and algorithm (an algorithms Name), "" for the skew rule's own.
	Window, Algo string
}

// Floor reports whether s is driven by the floor client instead of the
// service.
func (s Scenario) Floor() bool { return s.Alg == floorAlg }

// Upstream reports whether s loads envoyproxy/ratelimit instead of the
// service.
func (s Scenario) Upstream() bool { return s.Alg == upstreamAlg }

// FloorOf is the floor scenario s is compared with: the same keys (and
// distribution), descriptors and streams.
func (s Scenario) FloorOf() Scenario {
	return Scenario{Alg: floorAlg, Keys: s.Keys, Descriptors: s.Descriptors, Concurrency: s.Concurrency, Dist: s.Dist}
}

func keysName(keys int) string {
	if keys > 1 {
		return strconv.Itoa(keys/1000) + "k"
	}
	return "hot"
}

func modeName(denied bool) string {
	if denied {
		return "denied"
	}
	return "allowed"
}

// Name is the scenario's name in tables and in -run: alg/keys/mode/desc/conc,
// e.g. log/hot/allowed/1d/c200; a floor has no mode: floor/hot/1d/c200; a
// skewed-keys scenario is dist/target/desc/conc, e.g. zipf/service/1d/c64,
// and dist/target/algorithm-window/desc/conc on a rule of its own, e.g.
// zipf/service/gcra-second/1d/c64 (envoyproxy/ratelimit's: zipf/envoyproxy/second/1d/c64);
// a latency scenario latency/<rate>rps/target, e.g. latency/1000rps/service.
func (s Scenario) Name() string {
	if s.Dist != "" && s.Window != "" {
		return fmt.Sprintf("%s/%s/%s/%dd/c%d", s.Dist, targetName(s.Alg), s.ruleTag(), s.Descriptors, s.Concurrency)
	}
	if s.Rate > 0 {
		return fmt.Sprintf("latency/%drps/%s", s.Rate, targetName(s.Alg))
	}
	if s.Dist != "" {
		return fmt.Sprintf("%s/%s/%dd/c%d", s.Dist, targetName(s.Alg), s.Descriptors, s.Concurrency)
	}
	if s.Floor() {
		return fmt.Sprintf("%s/%s/%dd/c%d", s.Alg, keysName(s.Keys), s.Descriptors, s.Concurrency)
	}
	return fmt.Sprintf("%s/%s/%s/%dd/c%d", s.Alg, keysName(s.Keys), modeName(s.Denied), s.Descriptors, s.Concurrency)
}

// RuleKey is the descriptor entry key that selects the scenario's rule.
func (s Scenario) RuleKey() string {
	if s.Dist != "" {
		return skewRuleKey + s.ruleSuffix()
	}
	if s.Denied {
		return s.Alg + "_denied"
	}
	return s.Alg
}

// shapes are the (keys, descriptors, streams) combinations of the full
// matrix: every algorithm and mode at 1 descriptor per request with 50 and
// 200 streams, and at 3 descriptors (decided in one request) with 200.
var shapes = []struct{ keys, descriptors, concurrency int }{
	{1, 1, 50}, {1, 1, 200}, {1, 3, 200},
	{keyspace10k, 1, 50}, {keyspace10k, 1, 200}, {keyspace10k, 3, 200},
}

// allScenarios is the full matrix. Each shape's floor runs just before the
// algorithms it is compared with, so that a ratio to the floor compares
// figures measured close in time.
func allScenarios() []Scenario {
	var out []Scenario
	for _, sh := range shapes {
		out = append(out, Scenario{Alg: floorAlg, Keys: sh.keys, Descriptors: sh.descriptors, Concurrency: sh.concurrency})
		for _, alg := range algorithms {
			for _, denied := range []bool{false, true} {
				out = append(out, Scenario{Alg: alg.Name, Keys: sh.keys, Denied: denied, Descriptors: sh.descriptors, Concurrency: sh.concurrency})
			}
		}
	}
	return out
}

// quickScenarios is the representative subset of -quick, at 200 streams and
// one descriptor: every algorithm admitting on a hot key, the first one also
// denying and on 10k keys, and the floors they are compared with.
func quickScenarios() []Scenario {
	first := algorithms[0].Name
	out := []Scenario{{Alg: floorAlg, Keys: 1, Descriptors: 1, Concurrency: 200}}
	for _, alg := range algorithms {
		out = append(out, Scenario{Alg: alg.Name, Keys: 1, Descriptors: 1, Concurrency: 200})
	}
	return append(out,
		Scenario{Alg: first, Keys: 1, Denied: true, Descriptors: 1, Concurrency: 200},
		Scenario{Alg: floorAlg, Keys: keyspace10k, Descriptors: 1, Concurrency: 200},
		Scenario{Alg: first, Keys: keyspace10k, Descriptors: 1, Concurrency: 200},
	)
}

// selectScenarios returns the scenarios whose name matches run (all when run
// is empty), from the quick subset or the full matrix. With floors, the
// floor of each selected scenario is added before it when run left it out.
func selectScenarios(quick bool, run string, floors bool) ([]Scenario, error) {
	list := allScenarios()
	if quick {
		list = quickScenarios()
	}
	var re *regexp.Regexp
	if run != "" {
		var err error
		if re, err = regexp.Compile(run); err != nil {
			return nil, fmt.Errorf("-run: %w", err)
		}
	}
	var out []Scenario
	have := map[Scenario]bool{}
	for _, s := range list {
		if re != nil && !re.MatchString(s.Name()) || !floors && s.Floor() {
			continue
		}
		if f := s.FloorOf(); floors && !have[f] {
			out = append(out, f)
			have[f] = true
		}
		if !have[s] {
			out = append(out, s)
			have[s] = true
		}
	}
	return out, nil
}

// values are the descriptor values of request i of a workload with the
// given descriptors: i, i+3333, i+6666 (mod the 10k keyspace), distinct
// counters, each drawn uniformly. The hot key is value 0 (and 3333, 6666
// for its other descriptors).
func values(i, descriptors int) []string {
	step := keyspace10k / 3
	out := make([]string, descriptors)
	for d := range out {
		out[d] = strconv.Itoa((i + d*step) % keyspace10k)
	}
	return out
}

// requests builds the requests of a service scenario, shared read-only by
// all workers: one per key of the keyspace.
func requests(s Scenario) []*rlsv3.RateLimitRequest {
	ruleKey := s.RuleKey()
	out := make([]*rlsv3.RateLimitRequest, s.Keys)
	for i := range out {
		req := &rlsv3.RateLimitRequest{Domain: domain}
		for _, v := range values(i, s.Descriptors) {
			req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: ruleKey, Value: v}},
			})
		}
		out[i] = req
	}
	return out
}
