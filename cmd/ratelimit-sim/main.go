// Command ratelimit-sim measures how accurately each rate limit algorithm
// limits. It replays deterministic request traces through the real Lua
// scripts (a limiter.Limiter on an in-process miniredis whose clock follows
// the trace, running the Lua as Redis does: internal/luastore) and compares every decision with an exact sliding window
// computed in Go. The result is a Markdown table; docs/accuracy.md explains
// what each column means.
//
//	ratelimit-sim [-limit 100] [-window 10s] [-duration 5m] [-seed 1] [-trace all] [-burst 0]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	if os.Getenv("GOGC") == "" {
		// Every decision makes a lot of short-lived garbage (Lua tables,
		// replies). Collecting less often saves a fifth of the CPU for a
		// few tens of megabytes.
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line.
type options struct {
	Params
	traces   []string
	parallel int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("ratelimit-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	limit := fs.Uint("limit", 100, "units admitted per window")
	window := fs.Duration("window", 10*time.Second, "window length, whole seconds")
	duration := fs.Duration("duration", 5*time.Minute, "length of each trace")
	seed := fs.Uint64("seed", 1, "seed of the random traces")
	trace := fs.String("trace", "all", "trace to run: all, or a comma-separated list of "+strings.Join(traceNames, ", "))
	clients := fs.Int("clients", 1000, "clients of the many-clients trace")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "runs at once, each on its own miniredis")
	burst := fs.Uint("burst", 0, "gcra's bucket in units; 0: the limit")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o := options{
		Params: Params{
			Limit: uint32(*limit), Window: *window, Duration: *duration, Seed: *seed, Clients: *clients,
			Burst: uint32(*burst),
		},
		parallel: max(1, *parallel),
	}
	switch {
	case *limit < 1 || *limit > 100_000:
		return o, errors.New("-limit must be from 1 to 100000")
	case *window < time.Second || *window%time.Second != 0:
		return o, errors.New("-window must be a whole number of seconds")
	case *duration < *window:
		return o, errors.New("-duration must be at least one window")
	case *clients < 1:
		return o, errors.New("-clients must be at least 1")
	case *burst > 1_000_000:
		return o, errors.New("-burst must be at most 1000000")
	}
	if *trace == "all" {
		o.traces = traceNames
	} else {
		o.traces = strings.Split(*trace, ",")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-sim:", err)
		return 2
	}
	began := time.Now()
	report, err := simulate(ctx, o.Params, o.traces, o.parallel)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-sim:", err)
		return 1
	}
	writeMarkdown(stdout, o, report)
	fmt.Fprintf(stderr, "ratelimit-sim: %d decisions in %s on %d CPUs\n",
		report.decisions(), time.Since(began).Round(100*time.Millisecond), runtime.NumCPU())
	return 0
}

// Report is every trace's results: for each trace, the reference first,
// then the algorithms in order.
type Report struct {
	Traces  []*Trace
	Results [][]Result
}

func (r *Report) decisions() int {
	n := 0
	for i, tr := range r.Traces {
		n += len(tr.Requests) * (len(r.Results[i]) - 1)
	}
	return n
}

// simulate builds the traces, runs the reference on each, then every
// algorithm on every trace, parallel runs at once.
func simulate(ctx context.Context, p Params, names []string, parallel int) (*Report, error) {
	rep := &Report{}
	refs := make([][]bool, 0, len(names))
	for _, name := range names {
		tr, err := makeTrace(strings.TrimSpace(name), p)
		if err != nil {
			return nil, err
		}
		res, decisions := runReference(tr, p)
		rep.Traces = append(rep.Traces, tr)
		rep.Results = append(rep.Results, append(make([]Result, 0, 1+len(algorithms)), res))
		refs = append(refs, decisions)
	}
	for i := range rep.Results {
		rep.Results[i] = rep.Results[i][:1+len(algorithms)]
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type job struct{ trace, alg int }
	jobs := make(chan job)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				res, err := runAlgorithm(ctx, rep.Traces[j.trace], p, algorithms[j.alg], refs[j.trace])
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				rep.Results[j.trace][1+j.alg] = res
				mu.Unlock()
			}
		}()
	}
	// The longest traces first, so that the runs end together.
	order := make([]job, 0, len(rep.Traces)*len(algorithms))
	for t := range rep.Traces {
		for a := range algorithms {
			order = append(order, job{t, a})
		}
	}
	sortJobs := func(a, b job) int { return len(rep.Traces[b.trace].Requests) - len(rep.Traces[a.trace].Requests) }
	slices.SortStableFunc(order, sortJobs)
feed:
	for _, j := range order {
		select {
		case jobs <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return rep, nil
}
