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

// Scenario is one measured load: which rule, how many distinct keys, how many
// descriptors per request, how many concurrent streams.
type Scenario struct {
	Alg         string // log, counter or fixed: the rule key in bench.yaml
	Keys        int    // 1 (one hot key) or keyspace10k
	Denied      bool   // the *_denied rule (limit 1 per minute) instead of a limit far above the load
	Descriptors int    // descriptors per request, each its own counter
	Concurrency int    // workers, each with one request in flight
}

// Group is what the Redis ceiling depends on: the script hit, not how it is
// driven.
type Group struct {
	Alg    string
	Keys   int
	Denied bool
}

func (s Scenario) Group() Group { return Group{s.Alg, s.Keys, s.Denied} }

// Name is the scenario's name in tables and in -run: alg/keys/mode/desc/conc,
// e.g. log/hot/allowed/1d/c200.
func (s Scenario) Name() string {
	return fmt.Sprintf("%s/%dd/c%d", s.Group().Name(), s.Descriptors, s.Concurrency)
}

func (g Group) Name() string {
	keys := "hot"
	if g.Keys > 1 {
		keys = strconv.Itoa(g.Keys/1000) + "k"
	}
	mode := "allowed"
	if g.Denied {
		mode = "denied"
	}
	return g.Alg + "/" + keys + "/" + mode
}

// RuleKey is the descriptor entry key that selects the scenario's rule.
func (g Group) RuleKey() string {
	if g.Denied {
		return g.Alg + "_denied"
	}
	return g.Alg
}

var algorithms = []string{"log", "counter", "fixed"}

// allScenarios is the full matrix: 3 algorithms x hot/10k keys x
// allowed/denied x 1/3 descriptors x 50/200 streams = 48, grouped so that
// the scenarios sharing a Redis ceiling run one after the other.
func allScenarios() []Scenario {
	var out []Scenario
	for _, alg := range algorithms {
		for _, keys := range []int{1, keyspace10k} {
			for _, denied := range []bool{false, true} {
				for _, desc := range []int{1, 3} {
					for _, conc := range []int{50, 200} {
						out = append(out, Scenario{alg, keys, denied, desc, conc})
					}
				}
			}
		}
	}
	return out
}

// quickScenarios is the representative subset of -quick: the target scenario
// (the sliding log on a hot key at 200 streams) and one variation along each
// axis.
func quickScenarios() []Scenario {
	return []Scenario{
		{"log", 1, false, 1, 200},
		{"log", 1, false, 1, 50},
		{"log", keyspace10k, false, 3, 200},
		{"log", 1, true, 1, 200},
		{"counter", keyspace10k, false, 1, 200},
		{"fixed", 1, false, 1, 200},
	}
}

// selectScenarios returns the scenarios whose name matches run (all when run
// is empty), from the quick subset or the full matrix.
func selectScenarios(quick bool, run string) ([]Scenario, error) {
	list := allScenarios()
	if quick {
		list = quickScenarios()
	}
	if run == "" {
		return list, nil
	}
	re, err := regexp.Compile(run)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	var out []Scenario
	for _, s := range list {
		if re.MatchString(s.Name()) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-run %q matches no scenario (see -list)", run)
	}
	return out, nil
}

// requests builds the requests of a workload, shared read-only by all
// workers: one per key of the keyspace. Request i asks for the values i,
// i+3333, i+6666 (mod the keyspace): distinct counters, each drawn
// uniformly. The hot key is value 0 (and 3333, 6666 for its other
// descriptors).
func requests(g Group, descriptors int) []*rlsv3.RateLimitRequest {
	ruleKey := g.RuleKey()
	step := keyspace10k / 3
	out := make([]*rlsv3.RateLimitRequest, g.Keys)
	for i := range out {
		req := &rlsv3.RateLimitRequest{Domain: domain}
		for d := range descriptors {
			v := (i + d*step) % keyspace10k
			req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: ruleKey, Value: strconv.Itoa(v)}},
			})
		}
		out[i] = req
	}
	return out
}
