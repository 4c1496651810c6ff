package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Latency below saturation (issue 42): open-loop latency at fixed offered
// rates, each on three targets in a row: envoyproxy/ratelimit (the
// reference), the service at its shipped defaults, and the service with
// slices off (noSlicesArgs: every hit a Redis call). The traffic is the
// uniform skewed-keys scenario's (skew.go): one descriptor per request, its
// value drawn uniformly over uniformKeys keys, on the rule skewRuleKey (per
// minute, a limit nothing comes near), with its requests (skewRequests) and
// calls (skewCaller). The workers are paced (load.go): each has at most one
// call in flight, and a call's latency is counted from when it was due, so
// a target that stalls shows in the quantiles instead of slowing the load.

// noSlicesAlg is the Alg of the service with slices off.
const noSlicesAlg = "service-noslices"

// noSlicesArgs turn the service's slices off, hot and warm keys alike
// (docs/flags.md, --hot-key-threshold): the target noSlicesAlg is a second
// service started with them after the bench's own and -service-arg's.
var noSlicesArgs = []string{"--hot-key-threshold", "0"}

// latencyTargets are the targets of each rate, in run order.
var latencyTargets = []string{upstreamAlg, skewAlg, noSlicesAlg}

// The offered rates, requests/s: -latency-rates' default, and -quick's.
var (
	latencyRates      = rateList{500, 1000, 2000, 5000, 8000, 10_000}
	latencyQuickRates = rateList{1000, 5000}
)

// latencyMinWorkers is the fewest paced workers of a latency scenario.
const latencyMinWorkers = 64

// latencyWorkers is the paced workers of a latency scenario at rate with
// calls of the given deadline: each has at most one call in flight, and a
// call lasts the deadline at most, so rate × deadline of them would offer
// the rate even when every call runs to its deadline, with nothing to
// spare; twice as many do, with room for the bench's own delays;
// latencyMinWorkers at least.
func latencyWorkers(rate int, deadline time.Duration) int {
	return max(latencyMinWorkers, int(math.Ceil(2*float64(rate)*deadline.Seconds())))
}

// latencyScenarios are the latency scenarios of the rates: per rate, its
// targets in latencyTargets' order, so that they are measured seconds apart.
func latencyScenarios(rates []int, deadline time.Duration) []Scenario {
	var out []Scenario
	for _, rate := range rates {
		for _, alg := range latencyTargets {
			out = append(out, Scenario{Alg: alg, Keys: uniformKeys, Descriptors: 1, Concurrency: latencyWorkers(rate, deadline),
				Dist: distUniform, Rate: rate})
		}
	}
	return out
}

// selectLatency returns the latency scenarios of rates whose name matches
// run (all when run is empty); a selected service scenario brings
// envoyproxy/ratelimit's of its rate (with upstreams), as selectSkew. None
// when duration is 0 (-latency-duration 0).
func selectLatency(run string, rates []int, duration, deadline time.Duration, upstreams bool) ([]Scenario, error) {
	if duration == 0 {
		return nil, nil
	}
	return selectTargets(latencyScenarios(rates, deadline), run, false, upstreams)
}

// A latency scenario's target may be left with a backlog when its rate was
// past its capacity: calls whose callers gave up at their deadline, which
// it goes on with. Before the next scenario, settle waits until it is idle:
// until it used less than settleShare of a core over settleStep, settleMax
// at most.
const (
	settleStep  = 250 * time.Millisecond
	settleShare = 0.1
	settleMax   = 30 * time.Second
)

// settle waits until the process pid is idle (see settleStep) and returns
// how long it stayed busy, in steps: 0 when it was idle over the first
// one, settleMax when it never was.
func settle(ctx context.Context, pid int, tick float64) (time.Duration, error) {
	last, err := cpuTime(pid, tick)
	if err != nil {
		return 0, err
	}
	for busy := time.Duration(0); ; busy += settleStep {
		if err := sleep(ctx, settleStep); err != nil {
			return 0, err
		}
		now, err := cpuTime(pid, tick)
		if err != nil {
			return 0, err
		}
		if float64(now-last) < settleShare*float64(settleStep) || busy >= settleMax {
			return busy, nil
		}
		last = now
	}
}

// rateList is a flag of comma-separated rates, whole requests/s, each
// positive; setting it replaces the list.
type rateList []int

func (l *rateList) String() string {
	var parts []string
	for _, r := range *l {
		parts = append(parts, strconv.Itoa(r))
	}
	return strings.Join(parts, ",")
}

func (l *rateList) Set(v string) error {
	var out rateList
	for f := range strings.SplitSeq(v, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r <= 0 {
			return fmt.Errorf("%q is not a positive whole rate", f)
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return errors.New("no rate")
	}
	*l = out
	return nil
}

// writeLatency adds the latency section to the report: one row per rate
// and target, in the order measured.
func writeLatency(w io.Writer, rep *Report) {
	if len(rep.Latency) == 0 {
		return
	}
	o := rep.Options
	fmt.Fprintf(w, "\nLatency below saturation: open loop at fixed offered rates, per rate three targets in a row: "+
		"`envoyproxy` (envoyproxy/ratelimit, as above), `service` (the service at its shipped defaults) and `service-noslices` "+
		"(a second service, with `%s` added: slices off, every hit a Redis call); each cell %s of warm-up, then %s measured. "+
		"Traffic as `uniform` above: one descriptor per request, its value drawn uniformly over %s keys, rule `%s` (%s per %s: nothing is denied), "+
		"over %d gRPC connections, each call with a %s deadline. "+
		"Columns: offered/s, the rate the workers are paced to (workers: max(%d, 2 x rate x deadline), each with at most one call in flight, "+
		"so the rate is offered even if every call runs to its deadline); achieved/s, successful calls per second; "+
		"p50, p99, p999, the latency of every call, failed ones included, counted from when it was due, not when it was sent "+
		"(a stalled target, or bench, shows in it); deadline misses, calls that failed with DEADLINE_EXCEEDED, and their share; "+
		"errors, the other gRPC errors by code (and the service's failure-mode answers and store errors, when it counted any).\n",
		strings.Join(noSlicesArgs, " "), o.latWarmup, o.latDur, count(uniformKeys), skewRuleKey, count(skewLimit), skewUnit,
		o.conns, o.timeout, latencyMinWorkers)
	if rep.UpstreamErr != "" {
		fmt.Fprintf(w, "\n**envoyproxy/ratelimit was not measured:** %s.\n", rep.UpstreamErr)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| ! | offered/s | target | workers | achieved/s | p50 | p99 | p999 | deadline misses | errors |")
	fmt.Fprintln(w, "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	var marked []string
	for _, m := range rep.Latency {
		errs := m.ErrorSummary()
		if len(m.Counters) > 0 {
			errs += "; service: " + m.failureSummary()
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s |\n",
			markOf(m, &marked), count(float64(m.Rate)), targetName(m.Alg), m.Concurrency, count(m.perSecond(m.Requests)),
			ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)), ms(m.Latency.Quantile(0.999)), m.misses(), errs)
	}
	fmt.Fprintln(w)
	writeMarked(w, "latency scenario", marked, len(rep.Latency), o.timeout)
	var busy []string
	for _, m := range rep.Latency {
		if m.Busy > 0 {
			busy = append(busy, fmt.Sprintf("%s %s", m.Name(), m.Busy))
		}
	}
	if len(busy) > 0 {
		fmt.Fprintf(w, "\nTargets busy after their load stopped (a backlog of calls whose callers had given up), "+
			"each waited for, %s at most, before the next scenario: %s.\n", settleMax, strings.Join(busy, ", "))
	}
	writeMinuteEdges(w, rep.Latency)
}
