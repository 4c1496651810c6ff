package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
)

// The skewed keys (issue 32, hot-key leasing): one descriptor per request,
// its value drawn Zipf(s=1.2) over 100,000 keys (zipf) or uniformly over
// 10,000 (uniform), at 64 streams, on a rule whose limit is far above the
// load. Each distribution is measured on three targets in a row: the
// floor (INCRBY + EXPIRE from the bench), envoyproxy/ratelimit itself
// (upstream.go) and the service; besides the matrix's figures, the Redis
// commands per decision (INFO commandstats), and for zipf the latency of
// the hottest keys beside the coldest, each in its own histogram.

// The distributions.
const (
	distZipf    = "zipf"
	distUniform = "uniform"
	// distPaced is one key at its rule's pace, open loop (skewalgo.go).
	distPaced = "paced"
)

const (
	zipfKeys    = 100_000     // zipf draws value ranks 1..zipfKeys
	zipfS       = 1.2         // P(rank r) ∝ r^-zipfS (rand.Zipf: (v+k)^-s, k = r-1)
	zipfV       = 1.0         // rand.Zipf's v: rank 1 is k = 0
	zipfSeed    = 0x21bf      // with the worker's number, the seed of its Zipf generator
	uniformKeys = keyspace10k // uniform draws values 0..uniformKeys-1
	skewStreams = 64

	// hotRanks are the hot keys: the most frequent values, ranks 1..hotRanks
	// (about 48% of zipf's draws); the cold ones have a rank above coldRank
	// (about 15%).
	hotRanks = 10
	coldRank = 1000
)

// The targets of a skewed-keys scenario, as its Alg (floorAlg is the third).
const (
	skewAlg     = "skew"       // the service, on its rule skewRuleKey
	upstreamAlg = "envoyproxy" // envoyproxy/ratelimit, on the same rule in a file of its own
)

// The rule of the skewed-keys scenarios, in bench.yaml and in
// envoyproxy/ratelimit's file (upstreamConfig): no algorithm (the service's
// default), a limit no key comes near (TestSkewConfig checks that
// bench.yaml says the same).
const (
	skewRuleKey = "skew"
	skewUnit    = "minute"
	skewLimit   = 1_000_000_000

	// The per-second rules' limit, and the log's (config.MaxLogLimit), of
	// the skewed keys per algorithm and window.
	skewSecondLimit = 100_000_000
	skewLogLimit    = 10_000
)

// skewDists are the distributions in run and report order, with the keys
// each draws from.
var skewDists = []struct {
	name string
	keys int
}{{distZipf, zipfKeys}, {distUniform, uniformKeys}}

// targetName is a skewed-keys scenario's target in its name: service,
// floor or envoyproxy.
func targetName(alg string) string {
	if alg == skewAlg {
		return "service"
	}
	return alg
}

// skewScenarios are the skewed-keys scenarios: per distribution its floor,
// envoyproxy/ratelimit and the service, one after another so that their
// ratios compare figures measured seconds apart. -quick: zipf only.
func skewScenarios(quick bool) []Scenario {
	var out []Scenario
	for _, d := range skewDists {
		if quick && d.name != distZipf {
			continue
		}
		for _, alg := range []string{floorAlg, upstreamAlg, skewAlg} {
			out = append(out, Scenario{Alg: alg, Keys: d.keys, Descriptors: 1, Concurrency: skewStreams, Dist: d.name})
		}
	}
	return out
}

// holdsMinuteStart reports whether the interval of d from start holds the
// start of a minute (UTC), where the skew rule's windows end.
func holdsMinuteStart(start time.Time, d time.Duration) bool {
	return start.Truncate(time.Minute) != start.Add(d).Truncate(time.Minute)
}

// UpstreamOf is the envoyproxy/ratelimit scenario a skewed-keys scenario
// is compared with.
func (s Scenario) UpstreamOf() Scenario {
	s.Alg, s.Denied, s.Algo = upstreamAlg, false, ""
	if s.Window == skewUnit {
		s.Window = "" // the skewed keys' own rule
	}
	return s
}

// selectSkew returns the skewed-keys scenarios whose name matches run (all
// when run is empty), -quick's with quick (see selectTargets).
func selectSkew(quick bool, run string, floors, upstreams bool) ([]Scenario, error) {
	list := skewScenarios(quick)
	if !quick {
		list = append(list, skewAlgoScenarios()...)
	}
	return selectTargets(list, run, floors, upstreams)
}

// selectTargets returns the scenarios of list whose name matches run (all
// when run is empty). A selected scenario of the service (at its defaults
// or with slices off) brings the floor (with floors) and the
// envoyproxy/ratelimit scenario (with upstreams) of its keys and rate
// before it, when list has them, as a matrix scenario brings its floor;
// without floors or upstreams, they are left out even when run matches
// them.
func selectTargets(list []Scenario, run string, floors, upstreams bool) ([]Scenario, error) {
	re, err := regexp.Compile(run)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	keep := func(s Scenario) bool { return (floors || !s.Floor()) && (upstreams || !s.Upstream()) }
	var out []Scenario
	have := map[Scenario]bool{}
	add := func(s Scenario) {
		if keep(s) && !have[s] {
			out = append(out, s)
			have[s] = true
		}
	}
	for _, s := range list {
		if !re.MatchString(s.Name()) {
			continue
		}
		if !s.Floor() && !s.Upstream() {
			for _, ref := range []Scenario{s.FloorOf(), s.UpstreamOf()} {
				if slices.Contains(list, ref) {
					add(ref)
				}
			}
		}
		add(s)
	}
	return out, nil
}

// zipfClass is the class of the value of zipf rank i+1.
func zipfClass(i int) Class {
	switch {
	case i < hotRanks:
		return classHot
	case i >= coldRank:
		return classCold
	default:
		return classNone
	}
}

// sampler returns worker w's draw of a key of s's distribution: its index
// (the value's rank less one for zipf) and its class. Zipf draws from a
// generator of the worker's own, seeded with w, so that every target sees
// the same sequence per worker; uniform from the worker's generator.
func sampler(s Scenario, w int) func(rng *rand.Rand) (int, Class) {
	if s.Dist == distZipf {
		z := rand.NewZipf(rand.New(rand.NewPCG(uint64(w), zipfSeed)), zipfS, zipfV, uint64(s.Keys-1))
		return func(*rand.Rand) (int, Class) {
			i := int(z.Uint64())
			return i, zipfClass(i)
		}
	}
	return func(rng *rand.Rand) (int, Class) { return rng.IntN(s.Keys), classNone }
}

// skewRequests are the requests of a skewed-keys scenario, one per key,
// shared read-only by the workers of the service and of envoyproxy/ratelimit:
// request i asks for [{ruleKey, i}].
func skewRequests(ruleKey string, keys int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, keys)
	for i := range out {
		out[i] = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: ruleKey, Value: strconv.Itoa(i)}}},
		}}
	}
	return out
}

// skewCaller returns the call of worker w of a skewed-keys scenario s:
// ShouldRateLimit of the request of a key drawn from s's distribution,
// on connection w mod the connections.
func (l *Load) skewCaller(s Scenario, reqs []*rlsv3.RateLimitRequest) func(w int) ClassedCall {
	return func(w int) ClassedCall {
		client := l.rls[w%len(l.rls)]
		draw := sampler(s, w)
		return func(ctx context.Context, rng *rand.Rand) (uint64, uint64, string, Class) {
			i, class := draw(rng)
			decisions, overLimit, errCode := shouldRateLimit(ctx, client, reqs[i])
			return decisions, overLimit, errCode, class
		}
	}
}

// skewCaller returns the floor's call of a skewed-keys scenario s: INCRBY +
// EXPIRE of the counter of a key drawn from s's distribution,
// floor_<index>_<window start>.
func (f *floorClient) skewCaller(s Scenario) func(w int) ClassedCall {
	keys := make([][]string, s.Keys)
	for i := range keys {
		keys[i] = []string{"floor_" + strconv.Itoa(i) + "_"}
	}
	return func(w int) ClassedCall {
		draw := sampler(s, w)
		return func(ctx context.Context, rng *rand.Rand) (uint64, uint64, string, Class) {
			i, class := draw(rng)
			decisions, overLimit, errCode := f.decide(ctx, keys[i])
			return decisions, overLimit, errCode, class
		}
	}
}

// skewRig is what the skewed-keys and latency scenarios run on: the
// bench's Redis, floor client and service, the service's binary (for the
// one with slices off) and envoyproxy/ratelimit's ("" when it could not be
// built).
type skewRig struct {
	dir, redisAddr string
	bin            string
	redis          *process
	rdb            *redis.Client
	floor          *floorClient
	svc            *service
	load           *Load
	upstreamBin    string
	tick           float64
}

// runTargets measures the skewed-keys and the latency scenarios, adding
// them to rep.Skew and rep.Latency. envoyproxy/ratelimit is started before
// its first scenario and stopped after the last; when it cannot be
// started, or fails during a scenario, rep.UpstreamErr says why and its
// remaining scenarios are left out. The other targets' scenarios run
// whatever happens to it. The service with slices off is started before
// its first scenario and stopped after the last.
func runTargets(ctx context.Context, o options, rep *Report, list []Scenario, rig skewRig, stderr io.Writer) error {
	reqs := map[string][]*rlsv3.RateLimitRequest{}
	var up *upstream
	var upLoad, offLoad *Load
	var off *service
	defer func() {
		for _, l := range []*Load{upLoad, offLoad} {
			if l != nil {
				l.Close()
			}
		}
		if up != nil {
			up.stop(5 * time.Second)
		}
		if off != nil {
			off.stop(15 * time.Second)
		}
	}()
	upstreamFailed := func(err error) {
		rep.UpstreamErr = err.Error()
		fmt.Fprintf(stderr, "        envoyproxy/ratelimit: %v: its scenarios are left out\n", err)
	}
	for i, s := range list {
		if s.Upstream() && rep.UpstreamErr != "" {
			continue
		}
		fmt.Fprintf(stderr, "[%d/%d] %s ...\n", i+1, len(list), s.Name())
		id := s.Dist + "/" + s.RuleKey()
		if !s.Floor() && reqs[id] == nil {
			if len(reqs) >= 3 { // a rule's requests are 100,000 at most: keep a few
				clear(reqs)
			}
			reqs[id] = skewRequests(s.RuleKey(), s.Keys)
		}
		deadline := Deadline{D: o.timeout, Enforce: true}
		var newCall func(int) ClassedCall
		t := rig.svc.target()
		switch {
		case s.Floor():
			newCall, deadline.Enforce = rig.floor.skewCaller(s), false
		case s.Upstream():
			if up == nil {
				var err error
				if up, err = startUpstream(rig.upstreamBin, rig.dir, rig.redisAddr, o.upstreamEnv); err != nil {
					upstreamFailed(fmt.Errorf("starting it: %w", err))
					continue
				}
				rep.UpstreamEnv = up.env
				if upLoad, err = dial(ctx, up.grpcAddr, o.conns); err != nil {
					upstreamFailed(err)
					continue
				}
			}
			newCall, t = upLoad.skewCaller(s, reqs[id]), target{proc: up.process}
		case s.Alg == noSlicesAlg:
			if off == nil {
				var err error
				args := slices.Concat(o.svcArgs, noSlicesArgs)
				if off, _, err = startService(rig.bin, rig.dir, o.configPath, rig.redisAddr, args, o.svcEnv, o.cpuprofile != ""); err != nil {
					return fmt.Errorf("%s: %w", s.Name(), err)
				}
				if offLoad, err = dial(ctx, off.grpcAddr, o.conns); err != nil {
					return err
				}
			}
			newCall, t = offLoad.skewCaller(s, reqs[id]), off.target()
		default:
			newCall = rig.load.skewCaller(s, reqs[id])
		}
		m, err := measure(ctx, o, s, newCall, deadline, t, rig.redis.pid(), rig.rdb, rig.tick)
		if err != nil {
			if s.Upstream() && ctx.Err() == nil {
				upstreamFailed(fmt.Errorf("%s: %w", s.Name(), err))
				continue
			}
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		fmt.Fprintf(stderr, "        %s\n", m.summary())
		if s.Rate == 0 || s.Window != "" {
			rep.Skew = append(rep.Skew, m)
			continue
		}
		if m.Busy, err = settle(ctx, t.proc.pid(), rig.tick); err != nil {
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		if m.Busy > 0 {
			fmt.Fprintf(stderr, "        %s stayed busy %s after its load stopped\n", targetName(s.Alg), m.Busy)
		}
		rep.Latency = append(rep.Latency, m)
	}
	return nil
}

// commandsPerDecision is the Redis commands per decision of the measured
// interval (0 when there was no decision).
func (m *Measurement) commandsPerDecision() float64 {
	if m.Decisions == 0 {
		return 0
	}
	return float64(m.Commands) / float64(m.Decisions)
}

// ratio renders a / b as a multiple, "-" when either is missing (b not
// positive, or a negative).
func ratio(a, b float64) string {
	switch {
	case b <= 0 || a < 0:
		return "-"
	case a/b < 1:
		return fmt.Sprintf("%.2fx", a/b)
	default:
		return fmt.Sprintf("%.1fx", a/b)
	}
}

// skewIndex finds the measurement of each skewed-keys scenario.
type skewIndex map[Scenario]*Measurement

// of is the measurement of s, nil when s was not measured (or measured no
// decision).
func (ix skewIndex) of(s Scenario) *Measurement {
	if m := ix[s]; m != nil && m.Decisions > 0 {
		return m
	}
	return nil
}

// writeSkew adds the skewed-keys section to the report: a table of the
// scenarios, the service relative to envoyproxy/ratelimit and the floor
// per distribution, and zipf's hot and cold keys.
func writeSkew(w io.Writer, rep *Report) {
	o := rep.Options
	if len(rep.Skew) == 0 && rep.UpstreamErr == "" {
		return
	}
	fmt.Fprintf(w, "\nSkewed keys: %s measured after %s of warm-up each (-skew-warmup: the service leases a key once it has seen its rate "+
		"for a few seconds; these are steady-state figures), %d streams over %d gRPC connections, closed loop unless -rate, each call with a %s deadline, "+
		"one descriptor per request, its value drawn Zipf(s=%.1f) over %s keys (`zipf`, a generator per worker) or uniformly over %s (`uniform`); "+
		"rule `%s` of the service's config, naming no algorithm (the service's default applies), %s per %s: nothing is denied. "+
		"Beside the service, in a row: the floor, and envoyproxy/ratelimit (%s) with the same rule in a file of its own (fixed windows, "+
		"INCRBY + EXPIRE per descriptor). Redis commands: INFO commandstats over the measured interval, less INFO, "+
		"the commands Lua scripts run included.\n",
		o.duration, o.skewWarmup, skewStreams, o.conns, o.timeout, zipfS, count(zipfKeys), count(uniformKeys), skewRuleKey, count(skewLimit), skewUnit, upstreamModule)
	if rep.UpstreamErr != "" {
		fmt.Fprintf(w, "\n**envoyproxy/ratelimit was not measured:** %s.\n", rep.UpstreamErr)
	} else if len(rep.UpstreamEnv) > 0 {
		fmt.Fprintf(w, "envoyproxy/ratelimit ran with no argument and this environment alone: `%s`.", strings.Join(rep.UpstreamEnv, " "))
		if note := upstreamStatsNote(rep.UpstreamEnv); note != "" {
			fmt.Fprint(w, " "+note)
		}
		fmt.Fprintln(w)
	}
	ix := skewIndex{}
	var base []*Measurement // the skew rule's; the others in writeSkewAlgos
	for _, m := range rep.Skew {
		ix[m.Scenario] = m
		if m.Window == "" {
			base = append(base, m)
		}
	}
	defer writeSkewAlgos(w, rep, ix)
	if len(base) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| ! | scenario | decisions/s | p50 | p99 | deadline misses | errors | failure-mode answers | denied "+
		"| service CPU / decision | Redis CPU / decision | Redis commands / decision | Redis CPU vs floor |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	var marked []string
	for _, m := range base {
		failures, denied, svcCPU, vsFloor := m.failureSummary(), percent(m.deniedShare()), us(m.svcPerDecision()), "-"
		switch {
		case m.Floor():
			failures, denied, svcCPU = "-", "-", "-"
		case m.Upstream():
			failures = "-"
		}
		if f := ix.of(m.FloorOf()); f != nil && !m.Floor() && m.Decisions > 0 {
			vsFloor = ratio(float64(m.redisPerDecision()), float64(f.redisPerDecision()))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |\n",
			markOf(m, &marked), m.Name(), count(m.perSecond(m.Decisions)), ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)),
			m.misses(), m.ErrorSummary(), failures, denied, svcCPU, us(m.redisPerDecision()), m.commandsPerDecision(), vsFloor)
	}
	fmt.Fprintln(w)
	writeMarked(w, "skewed-keys scenario", marked, len(base), o.timeout)
	writeMinuteEdges(w, base)

	fmt.Fprintln(w)
	fmt.Fprintln(w, "The service relative to envoyproxy/ratelimit (its figure divided by the reference's) and to the floor, per decision, in this run:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| keys | Redis commands vs envoyproxy | Redis CPU vs envoyproxy | service CPU vs envoyproxy | Redis CPU vs floor |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, m := range base {
		if m.Alg != skewAlg {
			continue
		}
		cmds, redisCPU, svcCPU, vsFloor := "-", "-", "-", "-"
		if u := ix.of(m.UpstreamOf()); u != nil && m.Decisions > 0 {
			cmds = ratio(m.commandsPerDecision(), u.commandsPerDecision())
			redisCPU = ratio(float64(m.redisPerDecision()), float64(u.redisPerDecision()))
			svcCPU = ratio(float64(m.svcPerDecision()), float64(u.svcPerDecision()))
		}
		if f := ix.of(m.FloorOf()); f != nil && m.Decisions > 0 {
			vsFloor = ratio(float64(m.redisPerDecision()), float64(f.redisPerDecision()))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", m.Dist, cmds, redisCPU, svcCPU, vsFloor)
	}

	var zipf []*Measurement
	for _, m := range base {
		if m.Dist == distZipf {
			zipf = append(zipf, m)
		}
	}
	if len(zipf) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Zipf keys by rank, from the same runs, each class in its own histogram: hot, the %d most frequent values; "+
		"cold, the values of rank above %d; share of the calls, and latency of every call of the class (failed ones included):\n\n",
		hotRanks, coldRank)
	fmt.Fprintln(w, "| scenario | hot share | hot p50 | hot p99 | cold share | cold p50 | cold p99 | all p50 | all p99 |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, m := range zipf {
		calls := float64(max(1, m.Latency.Count()))
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.Name(),
			percent1(float64(m.Hot.Count())/calls), ms(m.Hot.Quantile(0.5)), ms(m.Hot.Quantile(0.99)),
			percent1(float64(m.Cold.Count())/calls), ms(m.Cold.Quantile(0.5)), ms(m.Cold.Quantile(0.99)),
			ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)))
	}
}

// writeCommandMix writes, for each skewed-keys scenario, the Redis commands
// per decision by command: where a decision's commands go (a decide call,
// the reads and writes its script makes, a slice's record and give back).
func writeCommandMix(w io.Writer, ms []*Measurement) {
	if !slices.ContainsFunc(ms, func(m *Measurement) bool { return len(m.CommandMix) > 0 }) {
		return
	}
	fmt.Fprintln(w, "\nRedis commands per decision by command, in the same measured intervals (INFO commandstats; "+
		"the commands a script or function runs counted under their own names, the call itself under FCALL or EVALSHA):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | commands / decision | by command |")
	fmt.Fprintln(w, "| --- | ---: | --- |")
	for _, m := range ms {
		if m.Decisions == 0 || len(m.CommandMix) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %.2f | %s |\n", m.Name(), m.commandsPerDecision(), commandMix(m.CommandMix, m.Decisions))
	}
}

// commandMix is mix per decision, the most called first, those under one
// call in a thousand decisions left out.
func commandMix(mix map[string]int64, decisions uint64) string {
	names := slices.Collect(maps.Keys(mix))
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(mix[b], mix[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, name := range names {
		if per := float64(mix[name]) / float64(decisions); per >= 0.001 {
			parts = append(parts, fmt.Sprintf("%s %.3f", name, per))
		}
	}
	return strings.Join(parts, ", ")
}
