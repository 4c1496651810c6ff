package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Machine describes where the bench ran.
type Machine struct {
	CPU, Kernel, Go, Redis, Commit string
	Cores                          int
	LoadBefore, LoadAfter          string
}

func describeMachine(root string) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	m.CPU = cpuModel()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		m.Redis = strings.TrimSpace(string(out))
		// "Redis server v=7.0.15 sha=... malloc=... bits=64 build=..."
		for _, f := range strings.Fields(m.Redis) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				m.Redis = v
			}
		}
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.Go = strings.TrimPrefix(strings.TrimSpace(string(out)), "go version ")
	}
	git := exec.Command("git", "rev-parse", "--short", "HEAD")
	git.Dir = root
	if out, err := git.Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		st := exec.Command("git", "status", "--porcelain", "--untracked-files=no")
		st.Dir = root
		if out, err := st.Output(); err == nil && len(strings.TrimSpace(string(out))) > 0 {
			m.Commit += " + uncommitted changes"
		}
	}
	m.LoadBefore = loadAverage()
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAverage is the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Derived numbers of a measurement.

func (m *Measurement) perSecond(n uint64) float64 { return float64(n) / m.Elapsed.Seconds() }

func perUnit(d time.Duration, n uint64) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

func (m *Measurement) svcPerDecision() time.Duration   { return perUnit(m.SvcCPU, m.Decisions) }
func (m *Measurement) redisPerDecision() time.Duration { return perUnit(m.RedisCPU, m.Decisions) }
func (m *Measurement) clientPerRequest() time.Duration { return perUnit(m.ClientCPU, m.Requests) }

func (m *Measurement) deniedShare() float64 {
	if m.Decisions == 0 {
		return 0
	}
	return float64(m.OverLimit) / float64(m.Decisions)
}

// calls is every call completed in the measured interval, failed ones
// included.
func (m *Measurement) calls() uint64 { return m.Requests + m.ErrorCount() }

// failed reports whether the scenario had a failure-mode answer, a store
// error, a shed request, a gRPC error or a missed deadline: the "!" of the
// report.
func (m *Measurement) failed() bool {
	return m.ErrorCount() > 0 || m.DeadlineMisses() > 0 || len(m.Counters) > 0
}

// failureSummary is the failure-mode answers by outcome, then in
// parentheses the store errors by kind and the shed requests, e.g.
// "allow 120 (store: timeout 118, canceled 2)"; "0" when there was none.
func (m *Measurement) failureSummary() string {
	var answers, store []string
	var shed string
	for _, k := range slices.Sorted(maps.Keys(m.Counters)) {
		v := m.Counters[k]
		switch {
		case strings.HasPrefix(k, failurePrefix):
			answers = append(answers, fmt.Sprintf("%s %.0f", strings.TrimPrefix(k, failurePrefix), v))
		case strings.HasPrefix(k, storeErrPrefix):
			store = append(store, fmt.Sprintf("%s %.0f", strings.TrimPrefix(k, storeErrPrefix), v))
		case k == shedCounter:
			shed = fmt.Sprintf("shed %.0f", v)
		}
	}
	out := "0"
	if len(answers) > 0 {
		out = strings.Join(answers, ", ")
	}
	var notes []string
	if len(store) > 0 {
		notes = append(notes, "store: "+strings.Join(store, ", "))
	}
	if shed != "" {
		notes = append(notes, shed)
	}
	if len(notes) > 0 {
		out += " (" + strings.Join(notes, "; ") + ")"
	}
	return out
}

// misses is the deadline misses with their share of the calls.
func (m *Measurement) misses() string {
	n := m.DeadlineMisses()
	if n == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", n, percent1(float64(n)/float64(max(1, m.calls()))))
}

// summary is the progress line of a measurement.
func (m *Measurement) summary() string {
	out := fmt.Sprintf("%s decisions/s, p50 %s, p99 %s, deadline misses %s, errors %s",
		count(m.perSecond(m.Decisions)), ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)),
		m.misses(), m.ErrorSummary())
	if !m.Floor() {
		out += fmt.Sprintf(", failure-mode answers %s, svc %s/dec", m.failureSummary(), us(m.svcPerDecision()))
	}
	return out + fmt.Sprintf(", redis %s/dec", us(m.redisPerDecision()))
}

// floorsOf indexes the floor measurements by scenario.
func floorsOf(ms []*Measurement) map[Scenario]*Measurement {
	out := map[Scenario]*Measurement{}
	for _, m := range ms {
		if m.Floor() {
			out[m.Scenario] = m
		}
	}
	return out
}

// floorRatio is m's Redis CPU per decision divided by its floor's, or "-"
// when the floor was not measured (or measured nothing).
func floorRatio(m *Measurement, floors map[Scenario]*Measurement) string {
	f := floors[m.FloorOf()]
	if m.Floor() || f == nil || f.redisPerDecision() == 0 || m.Decisions == 0 {
		return "-"
	}
	r := float64(m.redisPerDecision()) / float64(f.redisPerDecision())
	if r < 1 {
		return fmt.Sprintf("%.2fx", r)
	}
	return fmt.Sprintf("%.1fx", r)
}

// count renders a rate with thousands separators: 12,345.
func count(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

func percent(v float64) string  { return fmt.Sprintf("%.0f%%", 100*v) }
func percent1(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func writeMarkdown(w io.Writer, rep *Report) {
	o, mc := rep.Options, rep.Machine
	fmt.Fprintf(w, "Machine: %s, %d cores; %s; Redis %s; Linux %s.\n", mc.CPU, mc.Cores, mc.Go, mc.Redis, mc.Kernel)
	fmt.Fprintf(w, "Load average (1/5/15 min) %s at the start, %s at the end. Commit %s, %s UTC.\n",
		mc.LoadBefore, mc.LoadAfter, orUnknown(mc.Commit), rep.Began.UTC().Format("2006-01-02 15:04"))
	loop := "closed loop: each worker sends its next request as soon as the last one is answered"
	if o.rate > 0 {
		loop = fmt.Sprintf("open loop: %s requests/s in all, latency counted from when each request was due", count(o.rate))
	}
	fmt.Fprintf(w, "Command: `%s`: %s measured per scenario after %s of warm-up, %s deadline per call (grpc-timeout), "+
		"%d gRPC connections, floor on %d Redis connections, %s; took %s.\n",
		commandLine(o), o.duration, o.warmup, o.timeout, o.conns, o.floorConns, loop, rep.Took.Round(time.Second))
	fmt.Fprintf(w, "Service: `ratelimit %s`, every other flag at its default.\n\n", strings.Join(rep.ServiceArgs, " "))

	if len(rep.Measurements) > 0 {
		writeMatrix(w, rep)
	}
	writeSkew(w, rep)
	writeCommandMix(w, rep.Skew)
	writeLatency(w, rep)
	writeRLQS(w, rep.RLQS)
	writeBursts(w, o, rep.Bursts)
	writeSeats(w, o, rep.Seats)
	writeRegions(w, rep.Regions)

	for _, p := range rep.Profiles {
		fmt.Fprintf(w, "\nService CPU profile of %s (`go tool pprof -top -nodecount=%d` of %s):\n\n```\n%s\n```\n",
			p.Scenario, o.pprofTop, p.Path, strings.TrimSpace(p.Top))
	}
}

// writeMatrix writes the matrix's table, its marked scenarios and the
// ratios to the floor.
func writeMatrix(w io.Writer, rep *Report) {
	o := rep.Options
	fmt.Fprintln(w, "| ! | scenario | req/s | decisions/s | p50 | p99 | deadline misses | errors | failure-mode answers | denied "+
		"| service CPU / decision | Redis CPU / decision | Redis CPU vs floor | bench client CPU / req |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	floors := floorsOf(rep.Measurements)
	var marked []string
	for _, m := range rep.Measurements {
		failures, denied, svcCPU := m.failureSummary(), percent(m.deniedShare()), us(m.svcPerDecision())
		if m.Floor() {
			failures, denied, svcCPU = "-", "-", "-"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			markOf(m, &marked), m.Name(), count(m.perSecond(m.Requests)), count(m.perSecond(m.Decisions)),
			ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)), m.misses(), m.ErrorSummary(), failures, denied,
			svcCPU, us(m.redisPerDecision()), floorRatio(m, floors), us(m.clientPerRequest()))
	}
	fmt.Fprintln(w)
	writeMarked(w, "scenario", marked, len(rep.Measurements), o.timeout)
	writeFloorTable(w, rep.Measurements, floors)
}

// markOf is the "!" of a measurement that failed (see failed), adding its
// name to marked; "" otherwise.
func markOf(m *Measurement, marked *[]string) string {
	if !m.failed() {
		return ""
	}
	*marked = append(*marked, m.Name())
	return "!"
}

// writeMarked writes the line under a table of total measurements of one
// kind (what, singular): none marked, or which.
func writeMarked(w io.Writer, what string, marked []string, total int, timeout time.Duration) {
	if len(marked) == 0 {
		fmt.Fprintf(w, "No %s had a failure-mode answer, a store error, a gRPC error or a missed deadline (%s).\n", what, timeout)
		return
	}
	fmt.Fprintf(w, "**%d of %d %ss (!) had failure-mode answers, store errors, gRPC errors or missed deadlines (%s):** %s.\n",
		len(marked), total, what, timeout, strings.Join(marked, ", "))
}

// writeMinuteEdges names the measurements of the service at its defaults
// whose interval held a minute's start, where the skew rule's windows end.
func writeMinuteEdges(w io.Writer, ms []*Measurement) {
	var edges []string
	for _, m := range ms {
		if m.Alg == skewAlg && holdsMinuteStart(m.Start, m.Elapsed) {
			edges = append(edges, m.Name())
		}
	}
	if len(edges) > 0 {
		fmt.Fprintf(w, "\n%s measured across a minute's start, where the rule's windows end: every slice of them ends, gives back and is "+
			"leased again then (docs/bench.md, \"Skewed keys\").\n", strings.Join(edges, ", "))
	}
}

// writeFloorTable writes, per algorithm, its Redis CPU per decision as a
// multiple of the floor's measured in the same run, one column per keys,
// descriptors, streams and mode measured; the last row is the floor's own
// Redis CPU per decision.
func writeFloorTable(w io.Writer, ms []*Measurement, floors map[Scenario]*Measurement) {
	type column struct {
		keys, descriptors, concurrency int
		denied                         bool
	}
	colOf := func(m *Measurement) column { return column{m.Keys, m.Descriptors, m.Concurrency, m.Denied} }
	var cols []column
	cells := map[string]map[column]string{}
	var algs []string
	for _, m := range ms {
		if m.Floor() || floors[m.FloorOf()] == nil {
			continue
		}
		c := colOf(m)
		if !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
		if cells[m.Alg] == nil {
			cells[m.Alg] = map[column]string{}
			algs = append(algs, m.Alg)
		}
		cells[m.Alg][c] = floorRatio(m, floors)
	}
	if len(cols) == 0 {
		return
	}
	slices.SortStableFunc(cols, func(a, b column) int {
		return cmp.Or(cmp.Compare(a.keys, b.keys), cmp.Compare(a.descriptors, b.descriptors),
			cmp.Compare(a.concurrency, b.concurrency), cmpBool(a.denied, b.denied))
	})
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Redis CPU per decision as a multiple of the floor's (INCRBY + EXPIRE per decision, pipelined per request, "+
		"from the bench) with the same keys, descriptors and streams, in this run:")
	fmt.Fprintln(w)
	fmt.Fprint(w, "| algorithm |")
	for _, c := range cols {
		fmt.Fprintf(w, " %s %dd c%d %s |", keysName(c.keys), c.descriptors, c.concurrency, modeName(c.denied))
	}
	fmt.Fprint(w, "\n| --- |")
	for range cols {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	for _, alg := range algs {
		fmt.Fprintf(w, "| %s |", algName(alg))
		for _, c := range cols {
			fmt.Fprintf(w, " %s |", cmp.Or(cells[alg][c], "-"))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, "| floor: Redis CPU / decision |")
	for _, c := range cols {
		f := floors[Scenario{Alg: floorAlg, Keys: c.keys, Descriptors: c.descriptors, Concurrency: c.concurrency}]
		fmt.Fprintf(w, " %s |", us(f.redisPerDecision()))
	}
	fmt.Fprintln(w)
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	default:
		return 1
	}
}

// algName is the config name of a short algorithm name.
func algName(short string) string {
	for _, a := range algorithms {
		if a.Name == short {
			return a.Config
		}
	}
	return short
}

// commandLine is the bench's arguments, with -quick when BENCH_QUICK=1 set it.
func commandLine(o options) string {
	args := o.args
	if o.quick && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(strings.TrimLeft(a, "-"), "quick") }) {
		args = append([]string{"-quick"}, args...)
	}
	return strings.TrimSpace("go run ./cmd/ratelimit-bench " + strings.Join(args, " "))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
