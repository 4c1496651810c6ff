// Command ratelimit-bench measures the service at its shipped defaults:
// throughput, latency, failure-mode answers, missed deadlines and CPU per
// decision (of the service and of Redis) under closed-loop gRPC load (open
// loop with -rate), against a real redis-server, and compares Redis's CPU
// per decision with a floor: a plain client sending INCRBY + EXPIRE per
// decision to the same Redis.
//
// It builds the service (go build, no -race), starts a redis-server and the
// service on free loopback ports (no flag beyond addresses, config and Redis
// URL unless -service-arg says so), then for each scenario drives N workers
// sending ShouldRateLimit back to back (or at -rate) over a few shared
// HTTP/2 connections, each call with Envoy's deadline (grpc-timeout, 20 ms
// by default), measures for a bounded time after a warm-up, reads the CPU
// time of the service and Redis processes from /proc and the service's
// failure counters from its /metrics. Then it counts Redis commands per
// admitted request through RLQS, with emulated Envoys, and through
// ShouldRateLimit (rlqs.go), and sends bursts at one key per algorithm
// (burst.go). The skewed-keys scenarios (skew.go) draw their keys Zipf or
// uniformly, and measure envoyproxy/ratelimit itself (built with go
// install, upstream.go) beside the service and the floor, with the Redis
// commands per decision. Then the latency scenarios (latency.go) measure
// open-loop latency at fixed offered rates below saturation, on
// envoyproxy/ratelimit, the service and the service with slices off. Last,
// 50 callers contend for 5 seats of a concurrency limit over two instances
// (seats.go). It knows the service only through gRPC and /metrics.
// The report is Markdown on stdout; progress goes to stderr. docs/bench.md
// explains the columns.
//
//	ratelimit-bench [-quick] [-run REGEXP] [-duration 5s] [-warmup 1s] [-skew-warmup 20s] [-timeout 20ms]
//	                [-conns 4] [-floor-conns 10] [-rate 0] [-rlqs-duration 20s] [-seats-duration 10s] [-envoyproxy=true]
//	                [-latency-rates 500,1000,2000,5000,8000,10000] [-latency-warmup 5s] [-latency-duration 10s]
//	                [-cpuprofile DIR] [-list]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/envoyrlqs"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line.
type options struct {
	quick       bool
	run         string
	list        bool
	duration    time.Duration
	warmup      time.Duration
	skewWarmup  time.Duration
	floor       bool
	upstream    bool
	upstreamBin string
	upstreamEnv listFlag
	conns       int
	floorConns  int
	timeout     time.Duration
	rate        float64
	configPath  string
	binary      string
	cpuprofile  string
	pprofTop    int
	svcArgs     listFlag
	svcEnv      listFlag
	bursts      int
	rlqsDur     time.Duration
	seatsDur    time.Duration
	regionsDur  time.Duration
	latRates    rateList
	latWarmup   time.Duration
	latDur      time.Duration
	args        []string
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("ratelimit-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.quick, "quick", os.Getenv("BENCH_QUICK") == "1",
		"run the representative subset with short durations, about a minute and a half (also BENCH_QUICK=1)")
	fs.StringVar(&o.run, "run", "", "run only the scenarios whose name matches this regexp, e.g. 'log/hot/.*/c200' (see -list)")
	fs.BoolVar(&o.list, "list", false, "list the scenarios and exit")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per scenario (-quick: 3s)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "load before measuring, per scenario (-quick: 500ms)")
	fs.DurationVar(&o.skewWarmup, "skew-warmup", 20*time.Second,
		"load before measuring, per skewed-keys scenario (zipf, uniform): the service leases a key once it has seen "+
			"its rate for a few seconds, and these figures are of the steady state (-quick: 5s)")
	fs.BoolVar(&o.floor, "floor", true, "also run the floor (INCRBY + EXPIRE from the bench) of each selected scenario's keys, descriptors and streams")
	fs.BoolVar(&o.upstream, "envoyproxy", true,
		"also run envoyproxy/ratelimit (go install "+upstreamModule+") beside the selected skewed-keys scenarios (zipf, uniform); "+
			"-envoyproxy=false leaves it out (no ratio to it then)")
	fs.StringVar(&o.upstreamBin, "envoyproxy-binary", "", "a built envoyproxy/ratelimit binary to run instead of building it")
	fs.Var(&o.upstreamEnv, "envoyproxy-env",
		"an environment variable for envoyproxy/ratelimit, over the bench's own for it, e.g. -envoyproxy-env REDIS_PIPELINE_WINDOW=150us (repeatable)")
	fs.IntVar(&o.conns, "conns", 4, "gRPC (HTTP/2) connections the workers share")
	fs.IntVar(&o.floorConns, "floor-conns", 10, "Redis connections of the floor client (envoyproxy/ratelimit's REDIS_POOL_SIZE default)")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout,
		"deadline of each ShouldRateLimit call, sent as grpc-timeout (Envoy's rate limit filter default: 20ms)")
	fs.Float64Var(&o.rate, "rate", 0,
		"pace the workers to this many requests/s in all (open loop; latency counted from when a request was due); 0: closed loop, back to back")
	fs.StringVar(&o.configPath, "config", "", "the service's config (default bench/config/bench.yaml in the module)")
	fs.StringVar(&o.binary, "binary", "", "a built service binary to run instead of building ./cmd/ratelimit")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "directory: save a CPU profile of the service over each scenario's measured time, and print its top")
	fs.IntVar(&o.pprofTop, "pprof-top", 25, "lines of `go tool pprof -top` printed per profile")
	fs.Var(&o.svcArgs, "service-arg",
		"an extra flag for the service, e.g. -service-arg=--ratelimit-headers (repeatable; after the bench's own, so it wins)")
	fs.Var(&o.svcEnv, "service-env", "an environment variable for the service only, e.g. -service-env GOGC=400 (repeatable)")
	fs.IntVar(&o.bursts, "bursts", 3, "bursts per algorithm at one key, on a service started for them (see burst.go; -quick: 1); 0: none")
	fs.DurationVar(&o.rlqsDur, "rlqs-duration", 20*time.Second,
		"measured time of each RLQS run, at least 15s (three report intervals; see rlqs.go; -quick: 15s); 0: no RLQS runs")
	fs.DurationVar(&o.seatsDur, "seats-duration", 10*time.Second,
		"measured time of each seats run (see seats.go; -quick: 5s); 0: no seats runs")
	fs.DurationVar(&o.regionsDur, "regions-duration", 6*regionsWindow,
		"demand of the regions run before and after its shift, half each, then its cut and heal (see regions.go; -quick: none); 0: no regions run")
	o.latRates = slices.Clone(latencyRates)
	fs.Var(&o.latRates, "latency-rates",
		"offered rates of the latency scenarios, requests/s, comma-separated, each on three targets (see latency.go; -quick: "+
			latencyQuickRates.String()+")")
	fs.DurationVar(&o.latWarmup, "latency-warmup", 5*time.Second, "load before measuring, per latency scenario (-quick: 2s)")
	fs.DurationVar(&o.latDur, "latency-duration", 10*time.Second,
		"measured time of each latency scenario (-quick: 3s); 0: no latency scenarios")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		if !set["duration"] {
			o.duration = 3 * time.Second
		}
		if !set["warmup"] {
			o.warmup = 500 * time.Millisecond
		}
		if !set["skew-warmup"] {
			o.skewWarmup = 5 * time.Second
		}
		if !set["bursts"] {
			o.bursts = 1
		}
		if !set["rlqs-duration"] {
			o.rlqsDur = 3 * envoyrlqs.DefaultReportInterval
		}
		if !set["regions-duration"] {
			o.regionsDur = 0
		}
		if !set["seats-duration"] {
			o.seatsDur = 5 * time.Second
		}
		if !set["latency-rates"] {
			o.latRates = slices.Clone(latencyQuickRates)
		}
		if !set["latency-warmup"] {
			o.latWarmup = 2 * time.Second
		}
		if !set["latency-duration"] {
			o.latDur = 3 * time.Second
		}
	}
	switch {
	case o.duration < 100*time.Millisecond:
		return o, errors.New("-duration must be at least 100ms")
	case o.warmup < 0 || o.skewWarmup < 0 || o.latWarmup < 0:
		return o, errors.New("-warmup, -skew-warmup and -latency-warmup must not be negative")
	case o.latDur != 0 && o.latDur < 100*time.Millisecond:
		return o, errors.New("-latency-duration must be 0 or at least 100ms")
	case o.timeout <= 0:
		return o, errors.New("-timeout must be positive")
	case o.rate < 0:
		return o, errors.New("-rate must not be negative")
	case o.bursts < 0:
		return o, errors.New("-bursts must not be negative")
	case o.seatsDur < 0:
		return o, errors.New("-seats-duration must not be negative")
	case o.regionsDur < 0:
		return o, errors.New("-regions-duration must not be negative")
	case o.rlqsDur != 0 && o.rlqsDur < 3*envoyrlqs.DefaultReportInterval:
		return o, fmt.Errorf("-rlqs-duration must be 0 or at least %s", 3*envoyrlqs.DefaultReportInterval)
	case o.conns < 1 || o.floorConns < 1:
		return o, errors.New("-conns and -floor-conns must be at least 1")
	}
	o.args = args
	return o, nil
}

// defaultTimeout is -timeout's default: Envoy's rate limit filter's.
const defaultTimeout = 20 * time.Millisecond

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	scenarios, err := selectScenarios(o.quick, o.run, o.floor)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	bursts, err := selectBursts(o.bursts, o.run)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	rlqsCases, err := selectRLQS(o.quick, o.run, o.rlqsDur)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	skew, err := selectSkew(o.quick, o.run, o.floor, o.upstream)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	seats, err := selectSeats(o.run, o.seatsDur)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	latency, err := selectLatency(o.run, o.latRates, o.latDur, o.timeout, o.upstream)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	regions, err := selectRegions(o.run, o.regionsDur)
	if err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 2
	}
	if len(regions) == 0 {
		o.regionsDur = 0
	}
	targets := slices.Concat(skew, latency) // runTargets runs both, in this order
	if len(scenarios) == 0 && len(targets) == 0 && len(bursts) == 0 && len(rlqsCases) == 0 && len(seats) == 0 && len(regions) == 0 {
		fmt.Fprintf(stderr, "ratelimit-bench: -run %q matches no scenario, RLQS run, burst, seats or regions run (see -list)\n", o.run)
		return 2
	}
	if o.list {
		for _, s := range scenarios {
			fmt.Fprintln(stdout, s.Name())
		}
		for _, s := range targets {
			fmt.Fprintln(stdout, s.Name())
		}
		for _, c := range rlqsCases {
			fmt.Fprintln(stdout, c.Name())
		}
		for _, a := range bursts {
			fmt.Fprintln(stdout, burstName(a))
		}
		for _, c := range seats {
			fmt.Fprintln(stdout, c.Name())
		}
		for _, a := range regions {
			fmt.Fprintln(stdout, regionsRunName(a))
		}
		return 0
	}
	if err := bench(ctx, o, scenarios, targets, rlqsCases, bursts, seats, regions, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "ratelimit-bench:", err)
		return 1
	}
	return 0
}

// moduleRoot is the directory of the module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run from inside the module (github.com/slidingwindow/ratelimit)")
	}
	return filepath.Dir(gomod), nil
}

// Measurement is one scenario's numbers.
type Measurement struct {
	Scenario
	Result
	Elapsed                     time.Duration
	Start                       time.Time // of the measured interval
	SvcCPU, RedisCPU, ClientCPU time.Duration
	Counters                    map[string]float64 // the service's failure counters over the interval (parseCounters)
	Commands                    int64              // commands redis-server ran over the interval (INFO commandstats, less INFO)
	CommandMix                  map[string]int64   // the same, by command
	Profile                     string
	Busy                        time.Duration // a latency scenario's target after the load stopped (settle)
}

// Profile is the top of one scenario's CPU profile.
type Profile struct {
	Scenario, Path, Top string
}

// Report is everything measured in one run.
type Report struct {
	Machine      Machine
	Options      options
	ServiceArgs  []string // the service's command line, after its binary
	Measurements []*Measurement
	Skew         []*Measurement // the skewed-keys scenarios (skew.go)
	Latency      []*Measurement // the latency scenarios (latency.go)
	UpstreamErr  string         // why envoyproxy/ratelimit was not measured, when it was not
	UpstreamEnv  []string       // its environment, when it ran
	RLQS         []*RLQSRun
	Bursts       []*BurstResult
	Seats        []*SeatsRun
	Regions      []*RegionsRun
	Profiles     []Profile
	Began        time.Time
	Took         time.Duration
}

// bench runs everything selected: the matrix's scenarios, then targets
// (the skewed-keys and latency scenarios, runTargets), the RLQS runs, the
// bursts and the seats runs; then it writes the report.
func bench(ctx context.Context, o options, scenarios, targets []Scenario, rlqsCases []RLQSCase, bursts []Algorithm,
	seats []SeatsCase, regions []Algorithm, stdout, stderr io.Writer) error {
	began := time.Now()
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if o.configPath == "" {
		o.configPath = filepath.Join(root, "bench", "config", "bench.yaml")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return errors.New("redis-server is not on PATH (Debian: apt-get install redis-server)")
	}
	rep := &Report{Options: o, Began: began}
	rep.Machine = describeMachine(root)
	tick := clockTick()

	dir, err := os.MkdirTemp("", "ratelimit-bench")
	if err != nil {
		return err
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(stderr, "removing %s: %v\n", dir, err)
		}
	}()
	bin := o.binary
	if bin == "" {
		fmt.Fprintln(stderr, "building ./cmd/ratelimit ...")
		if bin, err = buildService(root, dir); err != nil {
			return err
		}
	}
	upstreamBin := o.upstreamBin
	if upstreamBin == "" && slices.ContainsFunc(targets, Scenario.Upstream) {
		fmt.Fprintf(stderr, "building envoyproxy/ratelimit (go install %s) ...\n", upstreamModule)
		if upstreamBin, err = buildUpstream(dir); err != nil {
			rep.UpstreamErr = "it could not be built: " + err.Error()
			fmt.Fprintf(stderr, "        %s: its scenarios are left out\n", rep.UpstreamErr)
			targets = slices.DeleteFunc(targets, Scenario.Upstream)
		}
	}

	redisProc, rdb, redisAddr, err := startRedis(dir)
	if err != nil {
		return err
	}
	defer redisProc.stop(time.Second)
	defer rdb.Close()
	floor := newFloorClient(redisAddr, o.floorConns)
	defer floor.Close()

	svc, svcArgs, err := startService(bin, dir, o.configPath, redisAddr, o.svcArgs, o.svcEnv, o.cpuprofile != "")
	if err != nil {
		return err
	}
	defer svc.stop(15 * time.Second)
	rep.ServiceArgs = svcArgs
	load, err := dial(ctx, svc.grpcAddr, o.conns)
	if err != nil {
		return err
	}
	defer load.Close()
	if o.cpuprofile != "" {
		if err := os.MkdirAll(o.cpuprofile, 0o755); err != nil {
			return err
		}
	}

	for i, s := range scenarios {
		fmt.Fprintf(stderr, "[%d/%d] %s ...\n", i+1, len(scenarios), s.Name())
		var newCall func(int) Call
		deadline := Deadline{D: o.timeout, Enforce: true}
		if s.Floor() {
			newCall, deadline.Enforce = floor.caller(s), false
		} else {
			newCall = load.caller(requests(s))
		}
		m, err := measure(ctx, o, s, classless(newCall), deadline, svc.target(), redisProc.pid(), rdb, tick)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		fmt.Fprintf(stderr, "        %s\n", m.summary())
		rep.Measurements = append(rep.Measurements, m)
	}
	if len(targets) > 0 {
		rig := skewRig{dir: dir, redisAddr: redisAddr, bin: bin, redis: redisProc, rdb: rdb, floor: floor, svc: svc, load: load,
			upstreamBin: upstreamBin, tick: tick}
		if err := runTargets(ctx, o, rep, targets, rig, stderr); err != nil {
			return err
		}
	}
	for i, c := range rlqsCases {
		fmt.Fprintf(stderr, "[%d/%d] %s ...\n", i+1, len(rlqsCases), c.Name())
		r, err := measureRLQS(ctx, o, c, svc, load, rdb)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name(), err)
		}
		fmt.Fprintf(stderr, "        %s\n", r.summary())
		rep.RLQS = append(rep.RLQS, r)
	}
	if err := svc.alive(); err != nil {
		return err
	}
	for _, alg := range bursts {
		fmt.Fprintf(stderr, "%s ...\n", burstName(alg))
		results, err := burstAlgorithm(ctx, o, bin, dir, redisAddr, alg)
		if err != nil {
			return fmt.Errorf("%s: %w", burstName(alg), err)
		}
		for _, b := range results {
			fmt.Fprintf(stderr, "        burst %d: %d OK, %d OVER_LIMIT, errors %s: %d let through in %s\n",
				b.Round, b.Admitted, b.Denied, b.errorSummary(), b.LetThrough(), ms(b.Took))
		}
		rep.Bursts = append(rep.Bursts, results...)
	}
	for _, c := range seats {
		fmt.Fprintf(stderr, "%s ...\n", c.Name())
		r, err := measureSeats(ctx, o, c, bin, dir, redisAddr, redisProc.pid(), tick, o.seatsDur)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name(), err)
		}
		fmt.Fprintf(stderr, "        %s\n", r.summary())
		rep.Seats = append(rep.Seats, r)
	}
	if len(regions) > 0 {
		fmt.Fprintln(stderr, "regions ...")
		if rep.Regions, err = measureRegions(ctx, o, bin, dir, regions, o.regionsDur, stderr); err != nil {
			return fmt.Errorf("regions: %w", err)
		}
	}
	for _, m := range slices.Concat(rep.Measurements, rep.Skew, rep.Latency) {
		if m.Profile == "" {
			continue
		}
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount="+strconv.Itoa(o.pprofTop), bin, m.Profile).CombinedOutput()
		if err != nil {
			out = append(out, []byte("\ngo tool pprof: "+err.Error())...)
		}
		rep.Profiles = append(rep.Profiles, Profile{m.Name(), m.Profile, string(out)})
	}
	rep.Machine.LoadAfter = loadAverage()
	rep.Took = time.Since(began)
	writeMarkdown(stdout, rep)
	fmt.Fprintf(stderr, "ratelimit-bench: %d scenarios in %s\n", len(scenarios)+len(rep.Skew)+len(rep.Latency), rep.Took.Round(time.Second))
	return nil
}

// target is the process a scenario's "service CPU" is read from, with its
// failure counters and its CPU profile: the service, or envoyproxy/ratelimit
// (neither counters nor profile).
type target struct {
	proc      *process
	counters  func() (map[string]float64, error) // nil: none
	pprofAddr string                             // the HTTP address serving /debug/pprof; "": none
}

// target is the service as a scenario's target.
func (s *service) target() target {
	return target{proc: s.process, counters: s.counters, pprofAddr: s.httpAddr}
}

// noCounters is the counters of a target without them.
func noCounters() (map[string]float64, error) { return map[string]float64{}, nil }

// timing is a scenario's warm-up, measured time and pace (requests/s in
// all; 0: closed loop): a latency scenario's own, else -warmup (or
// -skew-warmup for a skewed-keys scenario), -duration and -rate.
func (o options) timing(s Scenario) (warmup, duration time.Duration, rate float64) {
	switch {
	case s.Window != "" && s.Rate > 0: // a per-algorithm key at its pace
		return o.skewWarmup, o.duration, float64(s.Rate)
	case s.Rate > 0:
		return o.latWarmup, o.latDur, float64(s.Rate)
	case s.Dist != "":
		return o.skewWarmup, o.duration, o.rate
	default:
		return o.warmup, o.duration, o.rate
	}
}

// measure runs one scenario: a fresh database, warm-up, then the measured
// interval, with the processes' CPU time, the Redis commands and the
// target's counters read at both ends.
func measure(ctx context.Context, o options, s Scenario, newCall func(int) ClassedCall, deadline Deadline,
	t target, redisPid int, rdb *redis.Client, tick float64) (*Measurement, error) {
	if t.counters == nil {
		t.counters = noCounters
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	warmup, duration, rate := o.timing(s)
	r := StartClassed(s.Concurrency, deadline, rate, newCall)
	stopped := false
	defer func() {
		if !stopped {
			r.Stop()
		}
	}()
	if err := sleep(ctx, warmup); err != nil {
		return nil, err
	}
	m := &Measurement{Scenario: s}
	before, err := t.counters()
	if err != nil {
		return nil, err
	}
	var profile chan error
	if o.cpuprofile != "" && !s.Floor() && t.pprofAddr != "" {
		m.Profile = filepath.Join(o.cpuprofile, strings.ReplaceAll(s.Name(), "/", "_")+".pprof")
		secs := max(1, int(duration.Round(time.Second)/time.Second))
		profile = make(chan error, 1)
		go func() { profile <- fetchProfile(t.pprofAddr, secs, m.Profile) }()
	}
	commands0, err := redisCommandCounts(ctx, rdb)
	if err != nil {
		return nil, err
	}
	svc0, err1 := cpuTime(t.proc.pid(), tick)
	redis0, err2 := cpuTime(redisPid, tick)
	self0, err3 := cpuTime(0, tick)
	t0 := time.Now()
	m.Start = t0
	r.Measure()
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	if err := sleep(ctx, duration); err != nil {
		return nil, err
	}
	r.End()
	m.Elapsed = time.Since(t0)
	svc1, err1 := cpuTime(t.proc.pid(), tick)
	redis1, err2 := cpuTime(redisPid, tick)
	self1, err3 := cpuTime(0, tick)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	commands1, err := redisCommandCounts(ctx, rdb)
	if err != nil {
		return nil, err
	}
	m.Result = r.Stop()
	stopped = true
	m.SvcCPU, m.RedisCPU, m.ClientCPU = svc1-svc0, redis1-redis0, self1-self0
	m.CommandMix = map[string]int64{}
	for name, n := range commands1 {
		if d := n - commands0[name]; d > 0 {
			m.CommandMix[name] = d
			m.Commands += d
		}
	}
	after, err := t.counters()
	if err != nil {
		return nil, err
	}
	m.Counters = map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			m.Counters[k] = d
		}
	}
	if profile != nil {
		if err := <-profile; err != nil {
			return nil, err
		}
	}
	return m, t.proc.alive()
}

// End stops recording at once; Stop then collects the workers.
func (r *Run) End() { r.phase.Store(stopped) }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func fetchProfile(httpAddr string, seconds int, path string) error {
	client := &http.Client{Timeout: time.Duration(seconds+30) * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", httpAddr, seconds))
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("cpu profile: %s: %s", resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close() // the copy's error is the one to report
		return err
	}
	return f.Close()
}
