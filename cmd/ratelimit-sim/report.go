package main

import (
	"fmt"
	"io"
	"strings"
)

// steadyTraces are the traces of steady traffic, summed in the summary.
var steadyTraces = map[string]bool{
	"poisson-0.8x": true, "poisson-1.5x": true, "poisson-3x": true, "weighted-1.5x": true, "many-clients": true,
}

// writeMarkdown writes the report as Markdown tables.
func writeMarkdown(w io.Writer, o options, rep *Report) {
	fmt.Fprintf(w, "Limit %d per %s, traces of %s, seed %d (`%s`).\n\n",
		o.Limit, o.Window, o.Duration, o.Seed, commandLine(o))
	fmt.Fprintln(w, "| trace | algorithm | requests | admitted | wrongly admitted | wrongly denied | worst window |"+
		" vs independent reference: extra / missing admits |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for i, tr := range rep.Traces {
		for _, r := range rep.Results[i] {
			if r.Algorithm == referenceName {
				fmt.Fprintf(w, "| %s | %s | %d | %d | - | - | %.2fx | - |\n",
					tr.Name, r.Algorithm, r.Requests, r.Admitted, r.WorstOverAdmission())
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %s | %.2fx | %d / %d |\n",
				tr.Name, r.Algorithm, r.Requests, r.Admitted,
				share(r.WrongAdmits, r.Requests), share(r.WrongDenies, r.Requests),
				r.WorstOverAdmission(), r.ExtraAdmits, r.MissingAdmits)
		}
	}

	// Steady traffic, summed per algorithm.
	var steady []string
	sums := make(map[string]*Result)
	for i, tr := range rep.Traces {
		if !steadyTraces[tr.Name] {
			continue
		}
		steady = append(steady, tr.Name)
		for _, r := range rep.Results[i][1:] {
			s := sums[r.Algorithm]
			if s == nil {
				s = &Result{Algorithm: r.Algorithm}
				sums[r.Algorithm] = s
			}
			s.Requests += r.Requests
			s.WrongAdmits += r.WrongAdmits
			s.WrongDenies += r.WrongDenies
		}
	}
	if len(steady) > 0 {
		fmt.Fprintf(w, "\nSteady traffic (%s), summed:\n\n", strings.Join(steady, ", "))
		fmt.Fprintln(w, "| algorithm | requests | wrong decisions | wrongly admitted | wrongly denied |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
		for _, a := range algorithms {
			s := sums[a.String()]
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s |\n", s.Algorithm, s.Requests,
				share(s.WrongAdmits+s.WrongDenies, s.Requests), share(s.WrongAdmits, s.Requests), share(s.WrongDenies, s.Requests))
		}
	}

	for i, tr := range rep.Traces {
		if tr.Rates == nil {
			continue
		}
		fmt.Fprintf(w, "\n`%s` by the client's rate (wrong decisions: wrongly admitted and wrongly denied):\n\n", tr.Name)
		fmt.Fprint(w, "| client rate | clients | requests |")
		for _, r := range rep.Results[i][1:] {
			fmt.Fprintf(w, " %s |", r.Algorithm)
		}
		fmt.Fprint(w, "\n| --- | ---: | ---: |")
		for range rep.Results[i][1:] {
			fmt.Fprint(w, " ---: |")
		}
		fmt.Fprintln(w)
		for b := range bands {
			var label string
			switch b {
			case 0:
				label = fmt.Sprintf("%gx the limit and above", bands[b])
			case len(bands) - 1:
				label = fmt.Sprintf("below %gx the limit", bands[b-1])
			default:
				label = fmt.Sprintf("%gx to %gx the limit", bands[b], bands[b-1])
			}
			band := rep.Results[i][1].Bands[b]
			fmt.Fprintf(w, "| %s | %d | %d |", label, band.Clients, band.Requests)
			for _, r := range rep.Results[i][1:] {
				fmt.Fprintf(w, " %s |", share(r.Bands[b].Wrong, r.Bands[b].Requests))
			}
			fmt.Fprintln(w)
		}
	}

	fmt.Fprintln(w, "\nTraces:")
	fmt.Fprintln(w)
	for _, tr := range rep.Traces {
		fmt.Fprintf(w, "- `%s`: %s; %d requests, %d units.\n", tr.Name, tr.About, len(tr.Requests), tr.units())
	}
}

// share renders n of total as "n (p%)".
func share(n, total int) string {
	if total == 0 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%d (%.4f%%)", n, 100*float64(n)/float64(total))
}

// commandLine is the command that reproduces the report.
func commandLine(o options) string {
	trace := "all"
	if strings.Join(o.traces, ",") != strings.Join(traceNames, ",") {
		trace = strings.Join(o.traces, ",")
	}
	burst := ""
	if o.Burst > 0 {
		burst = fmt.Sprintf(" -burst %d", o.Burst)
	}
	return fmt.Sprintf("go run ./cmd/ratelimit-sim -limit %d -window %s -duration %s -seed %d -clients %d -trace %s%s",
		o.Limit, o.Window, o.Duration, o.Seed, o.Clients, trace, burst)
}
