package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Seats under contention (issue 33): seatCallers callers retrying at once
// on a concurrency limit of seatLimit, each admitted request holding its
// seat seatHold, over two service instances on one redis-server, with
// exactly the calls Envoy's rate limit filter makes (docs/budgets.md,
// "Concurrency limits"): the acquisition before routing on one instance,
// the stream-done call on the other, each with Envoy's deadline. The
// stream-done call is built from the first answer's dynamic metadata (a
// denied answer carries no lease id: no call). An acquisition that fails
// is let through, as Envoy's failure mode allow does, and its request
// runs. The ideal is every seat busy all the time: seatLimit × duration /
// seatHold admissions.
const (
	seatCallers = 50
	seatLimit   = 5 // the seats rules of bench.yaml
	seatHold    = 100 * time.Millisecond
)

// SeatsCase is a seats run: one, seats by lease id (a concurrency limit
// without lease ids is refused at load).
type SeatsCase struct{}

// Name is the case in -run and -list.
func (SeatsCase) Name() string { return "seats/leases" }

// rule is the case's key in bench.yaml.
func (SeatsCase) rule() string { return "seats" }

var seatsCases = []SeatsCase{{}}

// selectSeats is the cases whose Name matches run, none when duration is 0.
func selectSeats(run string, duration time.Duration) ([]SeatsCase, error) {
	if duration == 0 {
		return nil, nil
	}
	return matching(run, seatsCases, SeatsCase.Name)
}

// SeatsRun is one case's measurement.
type SeatsRun struct {
	SeatsCase
	Duration                  time.Duration // acquisitions are sent for this long
	Elapsed                   time.Duration // until the last caller's request and release were done
	Admitted, Denied, Lost    int64         // Lost: acquisitions that failed (let through)
	Releases                  int64
	MostInFlight              int64 // admitted requests running at once
	MostLetThrough            int64 // admitted and failed-open requests running at once
	Errors                    map[string]int
	Acquire, Release          Histogram
	SvcCPU, RedisCPU, SelfCPU time.Duration // the two instances' CPU together
}

// Ideal is the admissions of seats never idle while acquisitions are sent.
func (r *SeatsRun) Ideal() float64 {
	return float64(seatLimit) * float64(r.Duration) / float64(seatHold)
}

func (r *SeatsRun) summary() string {
	return fmt.Sprintf("%d admitted of an ideal %.0f (%.0f %%), %d denied, %d failed, at most %d in flight; "+
		"acquisition p50 %s, release p50 %s p99 %s", r.Admitted, r.Ideal(), 100*float64(r.Admitted)/r.Ideal(),
		r.Denied, r.Lost, r.MostInFlight, ms(r.Acquire.Quantile(0.5)), ms(r.Release.Quantile(0.5)), ms(r.Release.Quantile(0.99)))
}

// seatCounts are the callers' shared tallies.
type seatCounts struct {
	admitted, denied, lost, releases atomic.Int64
	inFlight, letThrough             atomic.Int64
	mostInFlight, mostLetThrough     atomic.Int64
	mu                               sync.Mutex
	errors                           map[string]int
	acquire, release                 Histogram
}

func raise(most *atomic.Int64, n int64) {
	for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
	}
}

// measureSeats starts two services on redisAddr, runs the case for
// duration and stops them.
func measureSeats(ctx context.Context, o options, c SeatsCase, bin, dir, redisAddr string, redisPid int, tick float64,
	duration time.Duration) (*SeatsRun, error) {
	var svcs []*service
	var loads []*Load
	defer func() {
		for _, l := range loads {
			l.Close()
		}
		for _, s := range svcs {
			s.stop(15 * time.Second)
		}
	}()
	for range 2 {
		s, _, err := startService(bin, dir, o.configPath, redisAddr, o.svcArgs, o.svcEnv, false)
		if err != nil {
			return nil, err
		}
		svcs = append(svcs, s)
		l, err := dial(ctx, s.grpcAddr, o.conns)
		if err != nil {
			return nil, err
		}
		loads = append(loads, l)
	}
	counts := &seatCounts{errors: map[string]int{}}
	user := fmt.Sprintf("user-%d", time.Now().UnixNano())
	cpu := func() (svc, redis, self time.Duration, err error) {
		for _, s := range svcs {
			d, err := cpuTime(s.pid(), tick)
			if err != nil {
				return 0, 0, 0, err
			}
			svc += d
		}
		if redis, err = cpuTime(redisPid, tick); err != nil {
			return 0, 0, 0, err
		}
		self, err = cpuTime(0, tick)
		return svc, redis, self, err
	}
	svc0, redis0, self0, err := cpu()
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	began := time.Now()
	timer := time.AfterFunc(duration, func() { close(done) })
	defer timer.Stop()
	var wg sync.WaitGroup
	for i := range seatCallers {
		acquireOn := loads[i%2].rls[i/2%o.conns]
		releaseOn := loads[(i+1)%2].rls[i/2%o.conns]
		wg.Go(func() { seatCaller(o.timeout, acquireOn, releaseOn, c.rule(), user, counts, done) })
	}
	wg.Wait()
	r := &SeatsRun{SeatsCase: c, Duration: duration, Elapsed: time.Since(began)}
	svc1, redis1, self1, err := cpu()
	if err != nil {
		return nil, err
	}
	r.SvcCPU, r.RedisCPU, r.SelfCPU = svc1-svc0, redis1-redis0, self1-self0
	r.Admitted, r.Denied, r.Lost, r.Releases = counts.admitted.Load(), counts.denied.Load(), counts.lost.Load(), counts.releases.Load()
	r.MostInFlight, r.MostLetThrough = counts.mostInFlight.Load(), counts.mostLetThrough.Load()
	r.Errors, r.Acquire, r.Release = counts.errors, counts.acquire, counts.release
	for _, s := range svcs {
		if err := s.alive(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// seatCaller is one caller: acquire, run the request when admitted (or
// let through on an error), send the stream-done call, again until done.
func seatCaller(timeout time.Duration, acquireOn, releaseOn rlsv3.RateLimitServiceClient, key, user string,
	counts *seatCounts, done <-chan struct{}) {
	var acquire, release Histogram
	errs := map[string]int{}
	defer func() {
		counts.mu.Lock()
		defer counts.mu.Unlock()
		counts.acquire.Merge(&acquire)
		counts.release.Merge(&release)
		for code, n := range errs {
			counts.errors[code] += n
		}
	}()
	call := func(client rlsv3.RateLimitServiceClient, d *rlcommon.RateLimitDescriptor) (*rlsv3.RateLimitResponse, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		return resp, time.Since(start), err
	}
	entries := func(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
		var es []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i < len(kv); i += 2 {
			es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return es
	}
	for {
		select {
		case <-done:
			return
		default:
		}
		first, took, err := call(acquireOn, &rlcommon.RateLimitDescriptor{Entries: entries(key, user), HitsAddend: wrapperspb.UInt64(1)})
		acquire.Record(took)
		admitted := err == nil && first.OverallCode == rlsv3.RateLimitResponse_OK
		switch {
		case err != nil:
			counts.lost.Add(1)
			errs[status.Code(err).String()]++
		case admitted:
			counts.admitted.Add(1)
		default:
			counts.denied.Add(1)
		}
		if err != nil || admitted { // the request runs
			raise(&counts.mostLetThrough, counts.letThrough.Add(1))
			if admitted {
				raise(&counts.mostInFlight, counts.inFlight.Add(1))
			}
			time.Sleep(seatHold)
			if admitted {
				counts.inFlight.Add(-1)
			}
			counts.letThrough.Add(-1)
		}
		// onDestroy: the stream-done call, when Envoy's actions produce its descriptor.
		id := first.GetDynamicMetadata().GetFields()["leases"].GetStructValue().GetFields()[key].GetStringValue()
		if id == "" {
			continue // no lease id: the metadata action drops the descriptor, no call
		}
		d := &rlcommon.RateLimitDescriptor{Entries: entries(key, user, "lease", id), HitsAddend: wrapperspb.UInt64(1), IsNegativeHits: true}
		counts.releases.Add(1)
		_, took, err = call(releaseOn, d)
		release.Record(took)
		if err != nil {
			errs["release "+status.Code(err).String()]++
		}
	}
}

// writeSeats adds the seats runs' table to the report.
func writeSeats(w io.Writer, o options, runs []*SeatsRun) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nSeats under contention: %d callers retrying at once on a limit of %d seats, "+
		"each admitted request holding its seat %s, two instances on one redis-server, each call with a %s deadline: "+
		"the acquisition on one instance, the stream-done call on the other (with leases, only for an answer carrying a lease id). "+
		"Ideal: every seat always busy. A failed acquisition is let through (Envoy's failure mode allow).\n\n",
		seatCallers, seatLimit, seatHold, o.timeout)
	fmt.Fprintln(w, "| mode | acquiring for | admitted | ideal | % of ideal | most in flight | most let through | denied | releases "+
		"| errors | acquisition p50 / p99 | release p50 / p99 | service CPU | Redis CPU | bench CPU |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range runs {
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.1f | %d | %d | %d | %d | %s | %s / %s | %s / %s | %s | %s | %s |\n",
			r.Name(), r.Duration, r.Admitted, r.Ideal(), 100*float64(r.Admitted)/r.Ideal(),
			r.MostInFlight, r.MostLetThrough, r.Denied, r.Releases, codeSummary(r.Errors),
			ms(r.Acquire.Quantile(0.5)), ms(r.Acquire.Quantile(0.99)), ms(r.Release.Quantile(0.5)), ms(r.Release.Quantile(0.99)),
			r.SvcCPU.Round(10*time.Millisecond), r.RedisCPU.Round(10*time.Millisecond), r.SelfCPU.Round(10*time.Millisecond))
	}
}
