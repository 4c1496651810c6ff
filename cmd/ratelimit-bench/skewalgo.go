package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// The skewed keys per algorithm and window: the same distributions and
// streams on a rule of each algorithm per second and per minute (bench.yaml's
// skew_<algorithm>_<window>, limits no key comes near: 100,000,000 a
// second, 1,000,000,000 a minute, the log's 10,000, its most), the service
// at its defaults and with slices off (each slice kind must save a third of
// the Redis CPU per decision where it serves: Zipf's hot keys, uniform's
// warm ones); envoyproxy/ratelimit
// per second beside them (skew_second in its file; per minute, its skewed
// keys' scenario). Not in -quick.
var (
	skewWindows = []string{"second", "minute"}
	skewAlgos   = []string{"log", "counter", "fixed", "gcra"}
)

// pacedRate is the limit per second of the paced GCRA rule
// (skew_paced_gcra_second) and the rate its one key is offered, open loop:
// the load GCRA's hot slice kind serves. Under its pace a bucket refills
// and takes no slice (no cell above reaches a key's pace); above it, the
// bucket is empty and takes none either.
const pacedRate = 10_000

// skewAlgoScenarios are the skewed keys per algorithm and window, in run
// order: per distribution and window, envoyproxy/ratelimit's per-second
// scenario, then each algorithm's service scenario and its slices-off one
// right after.
func skewAlgoScenarios() []Scenario {
	var out []Scenario
	for _, d := range skewDists {
		for _, win := range skewWindows {
			for _, a := range skewAlgos {
				s := Scenario{Alg: skewAlg, Keys: d.keys, Descriptors: 1, Concurrency: skewStreams, Dist: d.name, Window: win, Algo: a}
				if up := s.UpstreamOf(); up.Window != "" && !slices.Contains(out, up) {
					out = append(out, up)
				}
				out = append(out, s, s.NoSlicesOf())
			}
		}
	}
	// As many workers as the latency scenarios give the rate: each has one
	// call in flight, and the pace must hold at twice the deadline.
	paced := Scenario{Alg: skewAlg, Keys: 1, Descriptors: 1, Concurrency: latencyWorkers(pacedRate, defaultTimeout), Dist: distPaced,
		Window: "second", Algo: "gcra", Rate: pacedRate}
	return append(out, paced, paced.NoSlicesOf())
}

// ruleTag is a per-algorithm skewed-keys scenario's rule in its name:
// algorithm-window, or the window alone for envoyproxy/ratelimit's.
func (s Scenario) ruleTag() string {
	if s.Algo == "" {
		return s.Window
	}
	return s.Algo + "-" + s.Window
}

// ruleSuffix is what a skewed-keys scenario's rule key adds to
// skewRuleKey: _algorithm_window (_paced_algorithm_window at a key's
// pace), _window, or nothing.
func (s Scenario) ruleSuffix() string {
	var out string
	if s.Dist == distPaced {
		out = "_" + distPaced
	}
	for _, part := range []string{s.Algo, s.Window} {
		if part != "" {
			out += "_" + part
		}
	}
	return out
}

// NoSlicesOf is the slices-off scenario a skewed-keys scenario of the
// service is compared with.
func (s Scenario) NoSlicesOf() Scenario {
	s.Alg = noSlicesAlg
	return s
}

// writeSkewAlgos adds the skewed keys per algorithm and window to the
// report: each scenario's figures and, for the service at its defaults,
// its ratios to envoyproxy/ratelimit on the same window and to the service
// with slices off.
func writeSkewAlgos(w io.Writer, rep *Report, ix skewIndex) {
	var rows []*Measurement
	for _, m := range rep.Skew {
		if m.Window != "" {
			rows = append(rows, m)
		}
	}
	if len(rows) == 0 {
		return
	}
	o := rep.Options
	fmt.Fprintf(w, "\nSkewed keys per algorithm and window: as above (%s of warm-up, %s measured, %d streams), on a rule of each algorithm "+
		"per second (%s a second, the log %s) and per minute (%s a minute, the log %s: its hottest keys are denied), "+
		"the service at its defaults and with slices off (`%s`); envoyproxy/ratelimit on a rule of the same window "+
		"(per minute: its row above); `paced`: one key of a GCRA rule of %s a second offered %s a second, open loop (its pace: "+
		"the load GCRA's hot slices serve). Ratios: the service's figure per decision over envoyproxy/ratelimit's and over slices off's.\n\n",
		o.skewWarmup, o.duration, skewStreams, count(skewSecondLimit), count(skewLogLimit), count(skewLimit), count(skewLogLimit), strings.Join(noSlicesArgs, " "),
		count(pacedRate), count(pacedRate))
	fmt.Fprintln(w, "| ! | scenario | decisions/s | p50 | p99 | deadline misses | errors | denied | service CPU / decision | Redis CPU / decision "+
		"| Redis commands / decision | commands vs envoyproxy | Redis CPU vs envoyproxy | service CPU vs envoyproxy | commands vs slices off | Redis CPU vs slices off |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	var marked []string
	for _, m := range rows {
		cmds, redisCPU, svcCPU, vsOff, cpuVsOff := "-", "-", "-", "-", "-"
		if m.Alg == skewAlg && m.Decisions > 0 {
			if u := ix.of(m.UpstreamOf()); u != nil {
				cmds = ratio(m.commandsPerDecision(), u.commandsPerDecision())
				redisCPU = ratio(float64(m.redisPerDecision()), float64(u.redisPerDecision()))
				svcCPU = ratio(float64(m.svcPerDecision()), float64(u.svcPerDecision()))
			}
			if off := ix.of(m.NoSlicesOf()); off != nil {
				vsOff = ratio(m.commandsPerDecision(), off.commandsPerDecision())
				cpuVsOff = ratio(float64(m.redisPerDecision()), float64(off.redisPerDecision()))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %s | %s | %s | %s |\n",
			markOf(m, &marked), m.Name(), count(m.perSecond(m.Decisions)), ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)),
			m.misses(), m.ErrorSummary(), percent(m.deniedShare()), us(m.svcPerDecision()), us(m.redisPerDecision()), m.commandsPerDecision(),
			cmds, redisCPU, svcCPU, vsOff, cpuVsOff)
	}
	fmt.Fprintln(w)
	writeMarked(w, "per-algorithm skewed-keys scenario", marked, len(rows), o.timeout)
	var minutes []*Measurement // a per-second rule's windows end within every interval
	for _, m := range rows {
		if m.Window == "minute" {
			minutes = append(minutes, m)
		}
	}
	writeMinuteEdges(w, minutes)
}
