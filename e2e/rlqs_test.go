package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/envoyrlqs"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
)

// The Rate Limit Quota Service against Envoy's client as Envoy's source has
// it (internal/envoyrlqs): fleets of Envoys on one limit, with
// ShouldRateLimit on the same counter, through a service restart, and the
// store's work per admitted request.

const rlqsConfig = `
domain: rlqs
descriptors:
  - key: name
    value: fleet
    descriptors:
      - key: scenario
        # exact: the counter shows all the fleet leased
        rate_limit: {unit: minute, requests_per_unit: 600, algorithm: sliding_window_log}
  - key: name
    value: busy
    descriptors:
      - key: scenario
        rate_limit: {unit: minute, requests_per_unit: 6000}
`

const rlqsLimit = 600

// envoyConn dials the service as an Envoy cluster does: reconnecting
// within a second once the service is back.
func envoyConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func newEnvoy(t *testing.T, conn *grpc.ClientConn, opts envoyrlqs.Options) *envoyrlqs.Client {
	t.Helper()
	if opts.Domain == "" {
		opts.Domain = "rlqs"
	}
	c, err := envoyrlqs.New(conn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// admissions records when requests were admitted: under an assignment of
// the service's, or else (unassigned) under Envoy's own
// no_assignment_behavior or expired fallback, which no bound of the
// service's covers.
type admissions struct {
	mu                sync.Mutex
	times, unassigned []time.Time
}

func (a *admissions) add(at time.Time, assigned bool) {
	a.mu.Lock()
	if assigned {
		a.times = append(a.times, at)
	} else {
		a.unassigned = append(a.unassigned, at)
	}
	a.mu.Unlock()
}

// drive makes requests of bucket on c at perSecond until done closes.
func drive(c *envoyrlqs.Client, bucket map[string]string, perSecond float64, done <-chan struct{}, got *admissions) {
	every := time.Duration(float64(time.Second) / perSecond)
	for pause(done, every) {
		assigned := c.Assignment(bucket).From == envoyrlqs.FromServer
		if c.Allow(bucket) {
			got.add(time.Now(), assigned)
		}
	}
}

// within counts the times in [from, to) of sorted times.
func within(times []time.Time, from, to time.Time) int {
	lo, _ := slices.BinarySearchFunc(times, from, func(a, b time.Time) int { return a.Compare(b) })
	hi, _ := slices.BinarySearchFunc(times, to, func(a, b time.Time) int { return a.Compare(b) })
	return hi - lo
}

// bucketSizes samples each Envoy's token bucket every second: its size
// and how many buckets it was given so far (each started full).
type bucketSizes struct {
	mu      sync.Mutex
	samples [][]sample // per Envoy
}

type sample struct {
	at        time.Time
	maxTokens uint64
	created   int
}

func watchBuckets(envoys []*envoyrlqs.Client, bucket map[string]string, done <-chan struct{}) *bucketSizes {
	s := &bucketSizes{samples: make([][]sample, len(envoys))}
	take := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, e := range envoys {
			a := e.Assignment(bucket)
			s.samples[i] = append(s.samples[i], sample{time.Now(), a.MaxTokens, a.Created})
		}
	}
	take()
	go func() {
		for pause(done, time.Second) {
			take()
		}
	}()
	return s
}

// created is the token buckets each Envoy was given, at the last sample,
// and their sizes then.
func (s *bucketSizes) created() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, samples := range s.samples {
		last := samples[len(samples)-1]
		out = append(out, fmt.Sprintf("%d(M %d)", last.created, last.maxTokens))
	}
	return out
}

// bound is the published bound for the window [from, to): the limit, plus
// for each Envoy its largest bucket times one more than the buckets it was
// given within the window (a new bucket starts full). Samples a second
// apart: the window is widened by one on each side.
func (s *bucketSizes) bound(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := rlqsLimit
	for _, samples := range s.samples {
		var largest uint64
		first, last := -1, 0
		for _, x := range samples {
			if x.at.Before(from.Add(-time.Second)) || x.at.After(to.Add(time.Second)) {
				continue
			}
			largest = max(largest, x.maxTokens)
			if first < 0 {
				first = x.created
			}
			last = x.created
		}
		b += int(largest) * (1 + max(0, last-first))
	}
	return b
}

// TestRLQSFleetBound: 3 and 10 Envoys on 1 and 3 service instances, with
// equal and skewed demand at twice a limit of 600 a minute, admit at most
// the published bound in every minute, at least 90 % of the limit in every
// minute after the first two reports, and keep the counter exhausted for
// ShouldRateLimit (within a report interval of the end). The eight fleets run
// at once, each on its own counter.
func TestRLQSFleetBound(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	servers := make([]*server, 3)
	for i := range servers {
		servers[i] = startLibrary(t, r, rlqsConfig, nil)
	}
	type fleet struct {
		name         string
		instances, n int
		skewed       bool
		start        time.Time
		got          admissions
		sizes        *bucketSizes
		afterwards   *rlsv3.RateLimitResponse
		askErr       error
	}
	var fleets []*fleet
	for _, instances := range []int{1, 3} {
		for _, n := range []int{3, 10} {
			for _, skewed := range []bool{false, true} {
				name := fmt.Sprintf("instances=%d/envoys=%d/skewed=%v", instances, n, skewed)
				fleets = append(fleets, &fleet{name: name, instances: instances, n: n, skewed: skewed})
			}
		}
	}
	skew := map[int][]float64{3: {0.6, 0.3, 0.1}, 10: {0.3, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05}}
	const run = 75 * time.Second
	var all sync.WaitGroup
	for _, f := range fleets {
		bucket := map[string]string{"name": "fleet", "scenario": f.name}
		envoys := make([]*envoyrlqs.Client, f.n)
		for i := range envoys {
			envoys[i] = newEnvoy(t, envoyConn(t, servers[i%f.instances].grpcAddr), envoyrlqs.Options{})
		}
		all.Go(func() {
			done := make(chan struct{})
			var wg sync.WaitGroup
			f.start = time.Now()
			f.sizes = watchBuckets(envoys, bucket, done)
			for i, e := range envoys {
				share := 1 / float64(f.n)
				if f.skewed {
					share = skew[f.n][i]
				}
				wg.Go(func() { drive(e, bucket, 2*rlqsLimit/60.0*share, done, &f.got) })
			}
			waitUntil(f.start.Add(run))
			// The fleet's leases are on the counter ShouldRateLimit uses,
			// which they keep full. A report answered later than
			// rlqs.AnswerWithin on a loaded machine leaves a bucket without
			// its lease until the next report: ShouldRateLimit is asked
			// until it denies, for at most one report interval, the Envoys
			// still driving.
			until := time.Now().Add(envoyrlqs.DefaultReportInterval)
			for {
				f.afterwards, f.askErr = servers[0].rls.ShouldRateLimit(context.Background(),
					request("rlqs", descriptor("name", "fleet", "scenario", f.name)))
				if f.askErr != nil || f.afterwards.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT || time.Now().After(until) {
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
			close(done)
			wg.Wait()
		})
	}
	all.Wait()

	for _, f := range fleets {
		t.Run(f.name, func(t *testing.T) {
			byTime := func(a, b time.Time) int { return a.Compare(b) }
			slices.SortFunc(f.got.times, byTime)
			slices.SortFunc(f.got.unassigned, byTime)
			worst, least := 0, len(f.got.times)
			// Every minute-long window, a second apart. Requests Envoy let
			// through before its first assignment count, beside the bound.
			for from := f.start; !from.Add(time.Minute).After(f.start.Add(run)); from = from.Add(time.Second) {
				to := from.Add(time.Minute)
				unassigned := within(f.got.unassigned, from, to)
				admitted := within(f.got.times, from, to) + unassigned
				if bound := f.sizes.bound(from, to) + unassigned; admitted > bound {
					t.Errorf("minute from +%v: admitted %d, over the bound %d", from.Sub(f.start).Round(time.Second), admitted, bound)
				}
				worst = max(worst, admitted)
				if from.Sub(f.start) >= 2*envoyrlqs.DefaultReportInterval {
					least = min(least, admitted)
					if admitted < rlqsLimit*9/10 {
						t.Errorf("minute from +%v: admitted %d, under 90%% of %d", from.Sub(f.start).Round(time.Second), admitted, rlqsLimit)
					}
				}
			}
			t.Logf("most in a minute %d, least after two reports %d (limit %d, bound over the first minute %d, of which %d "+
				"let through before a first assignment); token buckets given %v", worst, least, rlqsLimit,
				f.sizes.bound(f.start, f.start.Add(time.Minute))+len(f.got.unassigned), len(f.got.unassigned), f.sizes.created())
			if f.askErr != nil || f.afterwards.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("ShouldRateLimit on the bucket the fleet exhausted: %v %v, want OVER_LIMIT", f.afterwards, f.askErr)
			}
		})
	}
}

// TestRLQSDenyAfterShouldRateLimit: ShouldRateLimit callers taking what
// the counter has left turn an Envoy's assignment to a deny within two
// reports. The service runs as shipped, hot keys' slices on: the callers'
// hits may be decided from slices, charged to the counter beside theirs.
func TestRLQSDenyAfterShouldRateLimit(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, rlqsConfig)
	e := newEnvoy(t, envoyConn(t, s.grpcAddr), envoyrlqs.Options{})
	bucket := map[string]string{"name": "fleet", "scenario": "reverse"}
	done := make(chan struct{})
	var got admissions
	var wg sync.WaitGroup
	defer func() { close(done); wg.Wait() }()
	wg.Go(func() { drive(e, bucket, 2, done, &got) }) // 120 a minute of 600
	waitFor(t, 20*time.Second, func() error {
		if a := e.Assignment(bucket); a.Kind != envoyrlqs.KindTokenBucket || a.From != envoyrlqs.FromServer {
			return fmt.Errorf("assignment %+v, want a token bucket", a)
		}
		return nil
	})
	// ShouldRateLimit callers take whatever the counter has left, as it
	// frees up.
	req := request("rlqs", descriptor("name", "fleet", "scenario", "reverse"))
	take := func() {
		req.HitsAddend = 1
		resp := s.ask(t, req)
		if left := resp.Statuses[0].LimitRemaining; resp.OverallCode == rlsv3.RateLimitResponse_OK && left > 0 {
			req.HitsAddend = left
			s.ask(t, req)
		}
	}
	take()
	taken := time.Now()
	// Two reports, and a third's time for the second's answer on a busy
	// machine.
	waitFor(t, 3*envoyrlqs.DefaultReportInterval, func() error {
		take()
		if a := e.Assignment(bucket); a.Kind != envoyrlqs.KindDenyAll {
			return fmt.Errorf("assignment %+v, want DENY_ALL", a)
		}
		return nil
	})
	t.Logf("DENY_ALL %v after ShouldRateLimit took the counter", time.Since(taken).Round(100*time.Millisecond))
	if e.Allow(bucket) {
		t.Error("a request was admitted under DENY_ALL")
	}
}

// TestRLQSServiceRestart: killed, the service's assignments expire and the
// Envoys fall back to their expired_assignment_behavior; back, the Envoys'
// next report reopens the stream and they get token buckets again.
func TestRLQSServiceRestart(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, rlqsConfig)
	fallback := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: 1, TokensPerFill: wrapperspb.UInt32(1), FillInterval: durationpb.New(time.Second),
	}}}
	bucket := map[string]string{"name": "fleet", "scenario": "restart"}
	envoys := make([]*envoyrlqs.Client, 2)
	for i := range envoys {
		envoys[i] = newEnvoy(t, envoyConn(t, s.grpcAddr), envoyrlqs.Options{Expired: fallback, ExpiredTimeout: time.Hour})
		envoys[i].Allow(bucket)
	}
	all := func(from envoyrlqs.Source) func() error {
		return func() error {
			for i, e := range envoys {
				if a := e.Assignment(bucket); a.Kind != envoyrlqs.KindTokenBucket || a.From != from {
					return fmt.Errorf("envoy %d holds %+v, want a token bucket from %v", i, a, from)
				}
			}
			return nil
		}
	}
	// The first Envoy's first report takes the whole limit; the second has
	// its share once the first has reported twice (docs/rlqs.md).
	waitFor(t, 4*envoyrlqs.DefaultReportInterval, all(envoyrlqs.FromServer))

	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.exited <- <-s.exited // waited for; left for the cleanup
	killed := time.Now()
	waitFor(t, rlqs.DefaultLease+5*time.Second, all(envoyrlqs.FromFallback))
	t.Logf("fell back %v after the kill (lease %v)", time.Since(killed).Round(100*time.Millisecond), rlqs.DefaultLease)
	opened := envoys[0].Stats().StreamsOpened

	back := startServer(t, r, rlqsConfig, "--grpc-addr", s.grpcAddr)
	waitFor(t, 4*envoyrlqs.DefaultReportInterval, all(envoyrlqs.FromServer))
	if got := envoys[0].Stats().StreamsOpened; got <= opened {
		t.Errorf("streams opened %d, then %d: the Envoy did not resubscribe", opened, got)
	}
	_ = back
}

// commandCalls is the number of commands redis-server ran, by INFO
// commandstats, less the INFO calls themselves.
func commandCalls(t *testing.T, r *redisServer) int64 {
	t.Helper()
	info, err := r.client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += c
	}
	return n
}

// TestRLQSStoreWork: Redis commands per admitted request on an RLQS
// bucket, against ShouldRateLimit on a bucket of the same limit in the
// same run: at least 20 times fewer.
func TestRLQSStoreWork(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startLibrary(t, r, rlqsConfig, nil)
	const perSecond = 200.0 // a limit of 6000 a minute: 100 a second
	const run = 20 * time.Second

	before := commandCalls(t, r)
	bucket := map[string]string{"name": "busy", "scenario": "rlqs"}
	envoys := make([]*envoyrlqs.Client, 3)
	done := make(chan struct{})
	var got admissions
	var wg sync.WaitGroup
	for i := range envoys {
		envoys[i] = newEnvoy(t, envoyConn(t, s.grpcAddr), envoyrlqs.Options{})
		wg.Go(func() { drive(envoys[i], bucket, perSecond/3, done, &got) })
	}
	waitUntil(time.Now().Add(run))
	close(done)
	wg.Wait()
	for _, e := range envoys {
		e.Close() // no more reports
	}
	rlqsCommands := commandCalls(t, r) - before
	rlqsAdmitted := len(got.times) + len(got.unassigned)

	before = commandCalls(t, r)
	req := request("rlqs", descriptor("name", "busy", "scenario", "rls"))
	admitted := 0
	done = make(chan struct{})
	end := time.Now().Add(run / 4)
	for pause(done, time.Duration(float64(time.Second)/(perSecond/2))) && time.Now().Before(end) {
		// Half the RLQS demand: within the limit, every request admitted.
		if s.ask(t, req).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	rlsCommands := commandCalls(t, r) - before
	if rlqsAdmitted == 0 || admitted == 0 {
		t.Fatalf("admitted %d through RLQS, %d through ShouldRateLimit", rlqsAdmitted, admitted)
	}
	perRLQS := float64(rlqsCommands) / float64(rlqsAdmitted)
	perRLS := float64(rlsCommands) / float64(admitted)
	t.Logf("RLQS: %d commands for %d admitted (%.4f each); ShouldRateLimit: %d for %d (%.3f each): %.0fx fewer",
		rlqsCommands, rlqsAdmitted, perRLQS, rlsCommands, admitted, perRLS, perRLS/perRLQS)
	if perRLS < 20*perRLQS {
		t.Errorf("RLQS costs %.4f commands per admitted request, ShouldRateLimit %.3f: want at least 20x fewer", perRLQS, perRLS)
	}
}

// TestRLQSStreamsEndOnSigterm: a stopping service ends its quota streams,
// which would otherwise hold the drain to its deadline, on either gRPC
// server.
func TestRLQSStreamsEndOnSigterm(t *testing.T) {
	t.Parallel()
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		s := startServer(t, startRedis(t), rlqsConfig, "--drain-timeout", "1m", "--grpc-server", kind)
		e := newEnvoy(t, envoyConn(t, s.grpcAddr), envoyrlqs.Options{})
		bucket := map[string]string{"name": "fleet", "scenario": "sigterm"}
		e.Allow(bucket)
		waitFor(t, 15*time.Second, func() error {
			if a := e.Assignment(bucket); a.From != envoyrlqs.FromServer {
				return fmt.Errorf("assignment %+v, want one from the service", a)
			}
			return nil
		})
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitCleanExit(t, s.exited) // within 15 s: the drain's deadline is a minute
		if strings.Contains(s.logs.String(), "drain deadline passed") {
			t.Error("the drain waited for its deadline: a quota stream held it")
		}
	})
}
