package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/netproxy"
)

// One limit across regions (docs/regions.md): three regions, each its own
// redis-server and service instance, and a ledger redis-server every
// region reaches through a proxy adding regionsLinkDelay each way. Demand
// at twice the global limit, spread unevenly over the regions, shifts
// midway; then the region with the most demand is cut from the ledger for
// regionsCutWindows windows, and healed for two. Each region sends, at
// every tick of its demand, one call on the global rule and one on a
// regional rule of the same numbers, whose latencies are compared.
const (
	regionsLimit     = 600              // per regionsWindow
	regionsWindow    = 10 * time.Second // the rules' window
	regionsShare     = 0.05             // regional_share: a floor of 30 each
	regionsLinkDelay = 50 * time.Millisecond
	// regionsLease is --global-lease: a quarter of it, a renewal's turn,
	// holds the round trips of a new connection to the ledger.
	regionsLease       = 4 * time.Second
	regionsCutWindows  = 3
	regionsHealWindows = 2
)

// regionsNames, and each region's share of the demand before and after the
// shift.
var (
	regionsNames  = []string{"us", "eu", "ap"}
	regionsBefore = []float64{0.6, 0.3, 0.1}
	regionsAfter  = []float64{0.1, 0.3, 0.6}
)

// regionsAlgorithms are the algorithms a global rule takes, each measured
// in a run of its own, in this order.
var regionsAlgorithms = []Algorithm{{"log", "sliding_window_log"}, {"counter", "sliding_window_counter"}, {"fixed", "fixed_window"}}

// regionsConfig is the services' config: per algorithm, the global rule
// (global_<name>) and its regional twin (regional_<name>).
func regionsConfig() string {
	rule := "  - key: %s_%s\n    rate_limit: {unit: second, unit_multiplier: %d, requests_per_unit: %d, algorithm: %s%s}\n"
	mult := int(regionsWindow / time.Second)
	out := "domain: regions\ndescriptors:\n"
	for _, a := range regionsAlgorithms {
		out += fmt.Sprintf(rule, "global", a.Name, mult, regionsLimit, a.Config,
			fmt.Sprintf(", global: true, regional_share: %g, when_cut: share", regionsShare))
		out += fmt.Sprintf(rule, "regional", a.Name, mult, regionsLimit, a.Config, "")
	}
	return out
}

// regionAdmission is an admitted global call: decided between sent and
// answered.
type regionAdmission struct {
	region         int
	sent, answered time.Time
}

// RegionsPhase is one phase of the regions run, measured.
type RegionsPhase struct {
	Name     string
	From, To time.Time
	Windows  int
	Admitted int
	// Most is the most admissions certainly within one window (sent at or
	// after its start, answered by its end) over windows ending in the
	// phase.
	Most int
	// LeastUse and MeanUse are the admissions answered in each whole window
	// of the phase after its first, over the limit.
	LeastUse, MeanUse float64
	// MostAligned is the most admissions certainly within one window
	// aligned as a fixed window's (from a multiple of its length since the
	// Unix epoch), over those ending in the phase.
	MostAligned int
}

// RegionsRun is the regions run's result, for one algorithm.
type RegionsRun struct {
	Algorithm        string
	Phases           []RegionsPhase
	Global, Regional Histogram // latency of every call, failed ones included
	Errors           map[string]int
}

// measureRegions runs the regions run of each of algs, one after another
// on the same processes: duration of demand before and after the shift
// (half each), then the cut and the heal.
func measureRegions(ctx context.Context, o options, bin, dir string, algs []Algorithm, duration time.Duration,
	stderr io.Writer) ([]*RegionsRun, error) {
	var cleanup []func()
	defer func() {
		for _, f := range slices.Backward(cleanup) {
			f()
		}
	}()
	cfg := filepath.Join(dir, "regions.yaml")
	if err := os.WriteFile(cfg, []byte(regionsConfig()), 0o644); err != nil {
		return nil, err
	}
	ledgerDir := filepath.Join(dir, "ledger")
	if err := os.MkdirAll(ledgerDir, 0o755); err != nil {
		return nil, err
	}
	ledger, ledgerClient, ledgerAddr, err := startRedis(ledgerDir)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	cleanup = append(cleanup, func() { _ = ledgerClient.Close(); ledger.stop(time.Second) })
	links := make([]*netproxy.Proxy, len(regionsNames))
	clients := make([]rlsv3.RateLimitServiceClient, len(regionsNames))
	for i, name := range regionsNames {
		rdir := filepath.Join(dir, "region-"+name)
		if err := os.MkdirAll(rdir, 0o755); err != nil {
			return nil, err
		}
		r, rc, raddr, err := startRedis(rdir)
		if err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		cleanup = append(cleanup, func() { _ = rc.Close(); r.stop(time.Second) })
		if links[i], err = netproxy.Start("127.0.0.1:0", ledgerAddr); err != nil {
			return nil, err
		}
		links[i].SetDelay(regionsLinkDelay)
		cleanup = append(cleanup, links[i].Close)
		args := slices.Concat([]string{"--region", name, "--regions", fmt.Sprint(len(regionsNames)),
			"--ledger-redis-url", "redis://" + links[i].Addr(), "--global-lease", regionsLease.String()}, o.svcArgs)
		s, _, err := startService(bin, rdir, cfg, raddr, args, o.svcEnv, false)
		if err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		cleanup = append(cleanup, func() { s.stop(15 * time.Second) })
		l, err := dial(ctx, s.grpcAddr, 1)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, l.Close)
		clients[i] = l.rls[0]
	}

	var runs []*RegionsRun
	for _, alg := range algs {
		fmt.Fprintf(stderr, "        regions: %s\n", alg.Name)
		run, err := regionsRun(ctx, o, alg, clients, links, duration, stderr)
		if err != nil {
			return nil, err
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// regionsRun runs the phases of one algorithm's global rule on the
// regions' services (clients) and their links to the ledger.
func regionsRun(ctx context.Context, o options, alg Algorithm, clients []rlsv3.RateLimitServiceClient, links []*netproxy.Proxy,
	duration time.Duration, stderr io.Writer) (*RegionsRun, error) {
	run := &RegionsRun{Algorithm: alg.Name, Errors: map[string]int{}}
	var mu sync.Mutex
	var admitted []regionAdmission
	request := func(key string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "regions", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: "acme"}}}}}
	}
	global, regional := request("global_"+alg.Name), request("regional_"+alg.Name)
	call := func(region int, req *rlsv3.RateLimitRequest, h *Histogram, record bool) {
		cctx, cancel := context.WithTimeout(ctx, o.timeout)
		sent := time.Now()
		resp, err := clients[region].ShouldRateLimit(cctx, req)
		cancel()
		answered := time.Now()
		mu.Lock()
		defer mu.Unlock()
		h.Record(answered.Sub(sent))
		switch {
		case err != nil:
			run.Errors[status.Code(err).String()]++
		case record && resp.OverallCode == rlsv3.RateLimitResponse_OK:
			admitted = append(admitted, regionAdmission{region, sent, answered})
		}
	}
	// drive offers twice the limit's rate for d, shared as shares says.
	drive := func(shares []float64, d time.Duration, during func()) {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for i, share := range shares {
			every := time.Duration(float64(regionsWindow) / (2 * regionsLimit * share))
			wg.Go(func() {
				tick := time.NewTicker(every)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					wg.Go(func() { call(i, global, &run.Global, true) })
					wg.Go(func() { call(i, regional, &run.Regional, false) })
				}
			})
		}
		if during != nil {
			during()
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		close(stop)
		wg.Wait()
	}
	phase := func(name string, shares []float64, d time.Duration, during func()) {
		from := time.Now()
		fmt.Fprintf(stderr, "        regions: %s, %s\n", name, d)
		drive(shares, d, during)
		run.Phases = append(run.Phases, RegionsPhase{Name: name, From: from, To: time.Now(), Windows: int(d / regionsWindow)})
	}
	half := max(regionsWindow, duration/2/regionsWindow*regionsWindow)
	phase("before the shift", regionsBefore, half, nil)
	phase("after the shift", regionsAfter, half, nil)
	cut := slices.Index(regionsAfter, slices.Max(regionsAfter))
	phase(regionsNames[cut]+" cut from the ledger", regionsAfter, regionsCutWindows*regionsWindow, links[cut].Cut)
	phase("healed", regionsAfter, regionsHealWindows*regionsWindow, func() {
		if err := links[cut].Heal(); err != nil {
			fmt.Fprintf(stderr, "        regions: healing %s's link: %v\n", regionsNames[cut], err)
		}
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	for i := range run.Phases {
		run.Phases[i].measure(admitted)
	}
	return run, nil
}

// alignedStart is the start of the fixed window holding t.
func alignedStart(t time.Time) time.Time {
	w := regionsWindow.Nanoseconds()
	return time.Unix(0, t.UnixNano()/w*w)
}

// measure fills p's counts from every admission of the run.
func (p *RegionsPhase) measure(all []regionAdmission) {
	for _, a := range all {
		if !a.answered.Before(p.From) && a.answered.Before(p.To) {
			p.Admitted++
		}
	}
	for _, end := range all {
		if end.answered.Before(p.From) || !end.answered.Before(p.To) {
			continue
		}
		n := 0
		for _, a := range all {
			if !a.sent.Before(end.answered.Add(-regionsWindow)) && !a.answered.After(end.answered) {
				n++
			}
		}
		p.Most = max(p.Most, n)
		from, aligned := alignedStart(end.answered), 0
		for _, a := range all {
			if !a.sent.Before(from) && !a.answered.After(end.answered) {
				aligned++
			}
		}
		p.MostAligned = max(p.MostAligned, aligned)
	}
	var uses []float64
	for k := 1; k < p.Windows; k++ {
		from := p.From.Add(time.Duration(k) * regionsWindow)
		n := 0
		for _, a := range all {
			if !a.answered.Before(from) && a.answered.Before(from.Add(regionsWindow)) {
				n++
			}
		}
		uses = append(uses, float64(n)/regionsLimit)
	}
	if len(uses) > 0 {
		p.LeastUse = slices.Min(uses)
		for _, u := range uses {
			p.MeanUse += u / float64(len(uses))
		}
	}
}

// writeRegions adds the regions runs' table to the report.
func writeRegions(w io.Writer, runs []*RegionsRun) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nOne limit across regions (docs/regions.md): three regions (%v), each its own redis-server and service "+
		"instance, a ledger redis-server each reaches through a proxy adding %s each way; a global rule of %d per %s of each "+
		"algorithm in a run of its own (regional_share %g, when_cut share, --global-lease %s), demand at twice its rate, shared %v "+
		"before the shift and %v after; then the region with the most demand cut from the ledger for %d windows, and healed. Each "+
		"tick of a region's demand also sends a call on a regional rule of the same numbers. Most in a window: admissions certainly "+
		"within one (sent after its start, answered by its end), of any window, and of a window aligned as a fixed window's; use: "+
		"admissions answered in each whole window of the phase after its first, over the limit.\n\n",
		regionsNames, regionsLinkDelay, regionsLimit, regionsWindow, regionsShare, regionsLease, regionsBefore, regionsAfter, regionsCutWindows)
	fmt.Fprintln(w, "| algorithm | phase | windows | admitted | most in a window | most in an aligned window | limit | least use of a window | mean use |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, run := range runs {
		for _, p := range run.Phases {
			least, mean := "-", "-"
			if p.Windows > 1 {
				least, mean = percent1(p.LeastUse), percent1(p.MeanUse)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %s | %s |\n", run.Algorithm, p.Name, p.Windows, p.Admitted, p.Most,
				p.MostAligned, regionsLimit, least, mean)
		}
	}
	fmt.Fprintln(w, "\nLatency of every call, all regions and phases:")
	fmt.Fprintln(w)
	for _, run := range runs {
		fmt.Fprintf(w, "- %s: global rule p50 %s, p99 %s (%d calls); regional rule p50 %s, p99 %s (%d calls); errors %v\n", run.Algorithm,
			ms(run.Global.Quantile(0.5)), ms(run.Global.Quantile(0.99)), run.Global.Count(),
			ms(run.Regional.Quantile(0.5)), ms(run.Regional.Quantile(0.99)), run.Regional.Count(), run.Errors)
	}
}

// regionsRunName is an algorithm's regions run's name in -run and -list.
func regionsRunName(a Algorithm) string { return "regions/" + a.Name }

// selectRegions returns the algorithms whose regions run is selected: run
// matches its name (or is empty); none when duration is 0.
func selectRegions(run string, duration time.Duration) ([]Algorithm, error) {
	if duration == 0 {
		return nil, nil
	}
	re, err := regexp.Compile(run)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	var out []Algorithm
	for _, a := range regionsAlgorithms {
		if re.MatchString(regionsRunName(a)) {
			out = append(out, a)
		}
	}
	return out, nil
}
