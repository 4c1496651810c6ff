package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Targets of the performance issue, for the sliding window log.
const (
	targetSvcCPU   = 15 * time.Microsecond
	targetRedisCPU = 8 * time.Microsecond
	targetP99      = 5 * time.Millisecond
	targetP99Conc  = 200
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
func (m *Measurement) scriptPerCall() time.Duration    { return perUnit(m.ScriptTime, m.EvalCalls) }

func (m *Measurement) deniedShare() float64 {
	if m.Decisions == 0 {
		return 0
	}
	return float64(m.OverLimit) / float64(m.Decisions)
}

// summary is the progress line of a measurement.
func (m *Measurement) summary() string {
	return fmt.Sprintf("%s req/s, %s decisions/s, p50 %s, p99 %s, errors %s, svc %s/dec, redis %s/dec",
		count(m.perSecond(m.Requests)), count(m.perSecond(m.Decisions)),
		ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)), m.ErrorSummary(),
		us(m.svcPerDecision()), us(m.redisPerDecision()))
}

// targets judges a sliding-log measurement against the targets.
func (m *Measurement) targets() string {
	if m.Alg != "log" {
		return ""
	}
	mark := func(ok bool) string {
		if ok {
			return "✓"
		}
		return "✗"
	}
	out := fmt.Sprintf("svc %s redis %s", mark(m.svcPerDecision() <= targetSvcCPU), mark(m.redisPerDecision() <= targetRedisCPU))
	if m.Concurrency == targetP99Conc {
		out += " p99 " + mark(m.Latency.Quantile(0.99) < targetP99 && m.ErrorCount() == 0)
	}
	return out
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

func percent(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }

func writeMarkdown(w io.Writer, rep *Report) {
	o, mc := rep.Options, rep.Machine
	fmt.Fprintf(w, "Machine: %s, %d cores; %s; Redis %s; Linux %s.\n", mc.CPU, mc.Cores, mc.Go, mc.Redis, mc.Kernel)
	fmt.Fprintf(w, "Load average (1/5/15 min) %s at the start, %s at the end. Commit %s, %s UTC.\n",
		mc.LoadBefore, mc.LoadAfter, orUnknown(mc.Commit), rep.Began.UTC().Format("2006-01-02 15:04"))
	loop := "closed loop: each worker sends its next request as soon as the last one is answered"
	if o.rate > 0 {
		loop = fmt.Sprintf("open loop: %s requests/s in all, latency counted from when each request was due", count(o.rate))
	}
	fmt.Fprintf(w, "Command: `%s`: %s measured per scenario after %s of warm-up, %d gRPC connections, %s; took %s.\n\n",
		commandLine(o), o.duration, o.warmup, o.conns, loop, rep.Took.Round(time.Second))

	fmt.Fprintln(w, "| scenario | req/s | decisions/s | p50 | p99 | errors | denied | service CPU / decision | Redis CPU / decision | script time / call | bench client CPU / req | of Redis ceiling -P 1 / -P 16 | log targets |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, m := range rep.Measurements {
		errs := m.ErrorSummary()
		if m.StoreErrors > 0 || m.Shed > 0 {
			errs += fmt.Sprintf(" (store errors %.0f, shed %.0f)", m.StoreErrors, m.Shed)
		}
		ratio := "-"
		if cs := rep.Ceilings[m.Group()]; len(cs) == 2 {
			dps := m.perSecond(m.Decisions)
			ratio = fmt.Sprintf("%s / %s", percent(dps/cs[0].PerSecond), percent(dps/cs[1].PerSecond))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			m.Name(), count(m.perSecond(m.Requests)), count(m.perSecond(m.Decisions)),
			ms(m.Latency.Quantile(0.5)), ms(m.Latency.Quantile(0.99)), errs, percent(m.deniedShare()),
			us(m.svcPerDecision()), us(m.redisPerDecision()), us(m.scriptPerCall()), us(m.clientPerRequest()),
			ratio, m.targets())
	}

	fmt.Fprintln(w)
	if rep.CeilingNote != "" {
		fmt.Fprintln(w, rep.CeilingNote)
	} else {
		fmt.Fprintln(w, "Redis ceiling: `redis-benchmark -c 50 -P 1|16 EVALSHA <decide> 1 KEY ARGV...`, one hit per call, the same key schema and ARGV the service sends for the scenario's rule (`-r 10000` draws the 10k keys):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| script hit | -P 1 calls/s | p50 / p99 | Redis CPU / call | script time / call | admitted | -P 16 calls/s | p50 / p99 | Redis CPU / call | script time / call | admitted |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, g := range rep.Groups {
			cs := rep.Ceilings[g]
			if len(cs) != 2 {
				continue
			}
			fmt.Fprintf(w, "| %s |", g.Name())
			for _, c := range cs {
				fmt.Fprintf(w, " %s | %s / %s ms | %s | %s | %s |", count(c.PerSecond), c.P50, c.P99,
					us(c.CPUPerCall()), us(c.ScriptTime), percent(c.Admitted))
			}
			fmt.Fprintln(w)
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintf(w, "Targets (sliding_window_log): at most %s of service CPU and %s of Redis CPU per decision, p99 under %s at %d concurrent streams. ",
		us(targetSvcCPU), us(targetRedisCPU), ms(targetP99), targetP99Conc)
	fmt.Fprintln(w, "Reference: envoyproxy/ratelimit does ~12-18k decisions/s at ~57 µs of service CPU + ~14 µs of Redis CPU per decision (fixed-window INCR) on this class of machine.")

	for _, p := range rep.Profiles {
		fmt.Fprintf(w, "\nService CPU profile of %s (`go tool pprof -top -nodecount=%d` of %s):\n\n```\n%s\n```\n",
			p.Scenario, o.pprofTop, p.Path, strings.TrimSpace(p.Top))
	}
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
