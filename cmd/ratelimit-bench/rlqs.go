package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidingwindow/ratelimit/internal/envoyrlqs"
)

// The RLQS store work (issue 25): Redis commands per admitted request on a
// Rate Limit Quota Service bucket, beside ShouldRateLimit on a bucket of the
// same rule in the same run, at a few request rates. Through RLQS the
// service touches Redis per Envoy and bucket once per report interval,
// whatever the requests; through ShouldRateLimit once per request. Both
// count every command redis-server ran (INFO commandstats, less INFO
// itself), the service's background work included.

// rlqsRuleKey is the bench.yaml rule of these runs: a limit above every
// rate offered, so demand stays under it and every request can be admitted.
// A bucket id {rlqsRuleKey: value} and a descriptor [{rlqsRuleKey, value}]
// resolve to the same rule, each value its own counter.
const rlqsRuleKey = "rlqs"

// rlqsPath names the two ways a request is decided.
const (
	pathRLQS = "RLQS"
	pathRLS  = "ShouldRateLimit"
)

// RLQSCase is one measured run: RLQS with Envoys emulated Envoys, or
// ShouldRateLimit (Envoys 0), at Rate requests/s in all.
type RLQSCase struct {
	Envoys int
	Rate   int
}

// Path is pathRLQS or pathRLS.
func (c RLQSCase) Path() string {
	if c.Envoys == 0 {
		return pathRLS
	}
	return pathRLQS
}

// Name is the case's name in -run and -list: rlqs/3envoys/400rps, or
// rlqs/ShouldRateLimit/400rps.
func (c RLQSCase) Name() string {
	if c.Envoys == 0 {
		return fmt.Sprintf("rlqs/%s/%drps", pathRLS, c.Rate)
	}
	return fmt.Sprintf("rlqs/%denvoys/%drps", c.Envoys, c.Rate)
}

// value is the rule value of the case: a counter of its own.
func (c RLQSCase) value() string { return fmt.Sprintf("e%d-r%d", c.Envoys, c.Rate) }

// rlqsEnvoys and rlqsRates are the full set's axes; -quick runs the first
// Envoys count at the second rate.
var (
	rlqsEnvoys = []int{3, 10}
	rlqsRates  = []int{100, 400, 1600}
)

// selectRLQS returns the cases whose name matches run (all when run is
// empty), each rate's ShouldRateLimit case first, added when a RLQS case of
// its rate is selected. None when duration is 0 (-rlqs-duration 0).
func selectRLQS(quick bool, run string, duration time.Duration) ([]RLQSCase, error) {
	if duration == 0 {
		return nil, nil
	}
	re, err := regexp.Compile(run)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	envoys, rates := rlqsEnvoys, rlqsRates
	if quick {
		envoys, rates = envoys[:1], rates[1:2]
	}
	var out []RLQSCase
	for _, rate := range rates {
		rls := RLQSCase{Rate: rate}
		var group []RLQSCase
		for _, n := range envoys {
			if c := (RLQSCase{Envoys: n, Rate: rate}); re.MatchString(c.Name()) {
				group = append(group, c)
			}
		}
		if len(group) > 0 || re.MatchString(rls.Name()) {
			out = append(append(out, rls), group...)
		}
	}
	return out, nil
}

// RLQSRun is what one case measured.
type RLQSRun struct {
	RLQSCase
	Elapsed  time.Duration
	Offered  uint64 // requests made in the measured interval
	Admitted uint64
	Commands int64 // commands redis-server ran in it
}

// perAdmitted is the Redis commands per admitted request (0 when none was
// admitted).
func (r *RLQSRun) perAdmitted() float64 {
	if r.Admitted == 0 {
		return 0
	}
	return float64(r.Commands) / float64(r.Admitted)
}

// commandCalls is the number of commands redis-server ran by INFO
// commandstats (lines cmdstat_<name>:calls=N,...), less the INFO calls.
func commandCalls(info string) (int64, error) {
	counts, err := commandCounts(info)
	var n int64
	for _, c := range counts {
		n += c
	}
	return n, err
}

// commandCounts is the calls of each command redis-server ran by INFO
// commandstats, by its name in upper case, but INFO.
func commandCounts(info string) (map[string]int64, error) {
	counts := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("commandstats line %q: %w", line, err)
		}
		counts[strings.ToUpper(strings.TrimPrefix(name, "cmdstat_"))] = c
	}
	return counts, nil
}

func redisCommands(ctx context.Context, rdb *redis.Client) (int64, error) {
	counts, err := redisCommandCounts(ctx, rdb)
	var n int64
	for _, c := range counts {
		n += c
	}
	return n, err
}

func redisCommandCounts(ctx context.Context, rdb *redis.Client) (map[string]int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return commandCounts(info)
}

// tally counts a run's requests while it is measuring.
type tally struct {
	phase             atomic.Int32 // warming, measuring, stopped (load.go)
	offered, admitted atomic.Uint64
}

func (t *tally) add(admitted bool) {
	if t.phase.Load() != measuring {
		return
	}
	t.offered.Add(1)
	if admitted {
		t.admitted.Add(1)
	}
}

// pace calls decide perSecond times a second until done closes, catching
// up on the requests that fell due while it slept, so that the rate holds
// on a busy machine.
func pace(perSecond float64, done <-chan struct{}, decide func()) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		for due := int(time.Since(start).Seconds() * perSecond); sent < due; sent++ {
			decide()
		}
	}
}

// measureRLQS runs one case against the service: for RLQS, c.Envoys
// emulated Envoys, each on its own connection, sharing the rate on one
// bucket, measured for duration once every Envoy holds a token bucket from
// the service and one more report interval has passed (their assignments
// then follow the demand they reported); for ShouldRateLimit, the load
// generator paced to the rate, measured for o.duration after o.warmup.
func measureRLQS(ctx context.Context, o options, c RLQSCase, svc *service, load *Load, rdb *redis.Client) (*RLQSRun, error) {
	if c.Envoys == 0 {
		return measureRLS(ctx, o, c, load, rdb)
	}
	conns := make([]*grpc.ClientConn, c.Envoys)
	envoys := make([]*envoyrlqs.Client, c.Envoys)
	defer func() {
		for i := range envoys {
			if envoys[i] != nil {
				envoys[i].Close()
			}
			if conns[i] != nil {
				_ = conns[i].Close() // the run is over: nothing is left to do about it
			}
		}
	}()
	for i := range envoys {
		conn, err := grpc.NewClient(svc.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		conns[i] = conn
		if envoys[i], err = envoyrlqs.New(conn, envoyrlqs.Options{Domain: domain}); err != nil {
			return nil, err
		}
	}
	bucket := map[string]string{rlqsRuleKey: c.value()}
	var counts tally
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(done); wg.Wait() }()
	for _, e := range envoys {
		wg.Go(func() { pace(float64(c.Rate)/float64(c.Envoys), done, func() { counts.add(e.Allow(bucket)) }) })
	}
	if err := awaitTokenBuckets(ctx, envoys, bucket); err != nil {
		return nil, err
	}
	if err := sleep(ctx, envoyrlqs.DefaultReportInterval); err != nil {
		return nil, err
	}
	return measureInterval(ctx, c, o.rlqsDur, &counts, rdb)
}

// awaitTokenBuckets waits until every Envoy holds a token bucket from the
// service for bucket.
func awaitTokenBuckets(ctx context.Context, envoys []*envoyrlqs.Client, bucket map[string]string) error {
	deadline := time.Now().Add(4 * envoyrlqs.DefaultReportInterval)
	for i, e := range envoys {
		for a := e.Assignment(bucket); a.Kind != envoyrlqs.KindTokenBucket || a.From != envoyrlqs.FromServer; a = e.Assignment(bucket) {
			if time.Now().After(deadline) {
				return fmt.Errorf("envoy %d holds %+v, not a token bucket from the service", i, a)
			}
			if err := sleep(ctx, 50*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// measureRLS drives ShouldRateLimit on the rule at the case's rate, one
// descriptor per request as Envoy's rate limit filter sends it.
func measureRLS(ctx context.Context, o options, c RLQSCase, load *Load, rdb *redis.Client) (*RLQSRun, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: rlqsRuleKey, Value: c.value()}}},
	}}
	streams := max(4, c.Rate/50) // each paced worker at most 50 requests/s
	r := Start(streams, Deadline{D: o.timeout, Enforce: true}, float64(c.Rate), load.caller([]*rlsv3.RateLimitRequest{req}))
	stopped := false
	defer func() {
		if !stopped {
			r.Stop()
		}
	}()
	if err := sleep(ctx, o.warmup); err != nil {
		return nil, err
	}
	before, err := redisCommands(ctx, rdb)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	r.Measure()
	if err := sleep(ctx, o.duration); err != nil {
		return nil, err
	}
	r.End()
	elapsed := time.Since(t0)
	after, err := redisCommands(ctx, rdb)
	if err != nil {
		return nil, err
	}
	res := r.Stop()
	stopped = true
	return &RLQSRun{RLQSCase: c, Elapsed: elapsed, Offered: res.Requests + res.ErrorCount(),
		Admitted: res.Decisions - res.OverLimit, Commands: after - before}, nil
}

// measureInterval counts the commands redis-server runs and the requests
// counts sees over d.
func measureInterval(ctx context.Context, c RLQSCase, d time.Duration, counts *tally, rdb *redis.Client) (*RLQSRun, error) {
	before, err := redisCommands(ctx, rdb)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	counts.phase.Store(measuring)
	if err := sleep(ctx, d); err != nil {
		return nil, err
	}
	counts.phase.Store(stopped)
	elapsed := time.Since(t0)
	after, err := redisCommands(ctx, rdb)
	if err != nil {
		return nil, err
	}
	return &RLQSRun{RLQSCase: c, Elapsed: elapsed, Offered: counts.offered.Load(),
		Admitted: counts.admitted.Load(), Commands: after - before}, nil
}

func (r *RLQSRun) summary() string {
	return fmt.Sprintf("%d offered, %d admitted, %d Redis commands (%.1f/s): %.4f per admitted request",
		r.Offered, r.Admitted, r.Commands, r.commandsPerSecond(), r.perAdmitted())
}

// commandsPerSecond is the Redis commands per second of the measured
// interval: through RLQS it follows the Envoys and buckets, not the rate.
func (r *RLQSRun) commandsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Commands) / r.Elapsed.Seconds()
}

// writeRLQS writes the runs' table: per row the path, Envoys, rate offered,
// measured time, requests offered and admitted, Redis commands in all and
// per second, commands per admitted request, and for RLQS rows
// ShouldRateLimit's figure at the same rate divided by it.
func writeRLQS(w io.Writer, runs []*RLQSRun) {
	if len(runs) == 0 {
		return
	}
	rls := map[int]*RLQSRun{}
	for _, r := range runs {
		if r.Envoys == 0 {
			rls[r.Rate] = r
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "RLQS store work: Redis commands (INFO commandstats, less INFO) per admitted request on a bucket of rule `%s`, "+
		"through RLQS (emulated Envoys, reports every %s) and through ShouldRateLimit, in this run:\n\n",
		rlqsRuleKey, envoyrlqs.DefaultReportInterval)
	fmt.Fprintln(w, "| path | Envoys | offered req/s | measured | offered | admitted | Redis commands | commands/s "+
		"| commands / admitted | ShouldRateLimit / RLQS |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range runs {
		envoys, ratio := "-", "-"
		if r.Envoys > 0 {
			envoys = strconv.Itoa(r.Envoys)
			if b := rls[r.Rate]; b != nil && r.perAdmitted() > 0 && b.perAdmitted() > 0 {
				ratio = fmt.Sprintf("%.0fx", b.perAdmitted()/r.perAdmitted())
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.1f | %.4f | %s |\n", r.Path(), envoys, count(float64(r.Rate)),
			r.Elapsed.Round(100*time.Millisecond), count(float64(r.Offered)), count(float64(r.Admitted)),
			count(float64(r.Commands)), r.commandsPerSecond(), r.perAdmitted(), ratio)
	}
}
