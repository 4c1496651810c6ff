package service

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// The rules of the benchmarks: one per algorithm, limits far above what a
// benchmark sends (as bench/config/bench.yaml, which cmd/ratelimit-bench
// drives over gRPC against a real redis-server).
const benchRulesYAML = `
domain: bench
descriptors:
  - key: log
    rate_limit: {unit: second, requests_per_unit: 10000, algorithm: sliding_window_log}
  - key: counter
    rate_limit: {unit: minute, requests_per_unit: 1000000000, algorithm: sliding_window_counter}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 1000000000, algorithm: fixed_window}
`

const benchKeyspace = 10_000

// newBenchService serves benchRulesYAML with metrics on, as the binary does,
// deciding with decider.
func newBenchService(b *testing.B, decider Decider, opts Options) *Service {
	b.Helper()
	cfg, err := config.Parse("bench.yaml", []byte(benchRulesYAML), config.Defaults{})
	if err != nil {
		b.Fatal(err)
	}
	opts.Metrics = metrics.New(prometheus.NewRegistry())
	return New(cfg, decider, &opts)
}

// benchRequests returns benchKeyspace requests of n descriptors on the rule
// key: request i asks for the values i, i+3333, i+6666, distinct counters.
func benchRequests(key string, n int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, benchKeyspace)
	for i := range reqs {
		req := &rlsv3.RateLimitRequest{Domain: "bench"}
		for d := range n {
			req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: strconv.Itoa((i + d*benchKeyspace/3) % benchKeyspace)}},
			})
		}
		reqs[i] = req
	}
	return reqs
}

// BenchmarkShouldRateLimit is a whole decision through the real limiter and
// go-redis, on an in-process miniredis (whose Lua interpreter costs more than
// Redis's: compare service CPU with cmd/ratelimit-bench, not this). Requests
// cycle over 10000 keys per descriptor, all admitted.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, alg := range []string{"log", "counter", "fixed"} {
		for _, n := range []int{1, 3} {
			b.Run(alg+"/"+strconv.Itoa(n)+"d", func(b *testing.B) {
				s := newMiniredisBenchService(b)
				reqs := benchRequests(alg, n)
				ctx := context.Background()
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					resp, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)])
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Fatalf("%v %v", resp, err)
					}
				}
			})
		}
	}
}

// BenchmarkShouldRateLimitParallel is BenchmarkShouldRateLimit for the
// sliding log with GOMAXPROCS goroutines at once: concurrent requests share
// the store's pipelines.
func BenchmarkShouldRateLimitParallel(b *testing.B) {
	s := newMiniredisBenchService(b)
	reqs := benchRequests("log", 1)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func newMiniredisBenchService(b *testing.B) *Service {
	b.Helper()
	m, _ := luastore.RunT(b)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 64})
	lim := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second})
	b.Cleanup(func() {
		lim.Close()
		if err := client.Close(); err != nil {
			b.Error(err)
		}
	})
	return newBenchService(b, decision.Direct(lim), Options{})
}

// admitAll is a store that admits every hit at once: with it, a benchmark
// measures the service's own work (validation, matching, keys, the answer,
// metrics), without go-redis or a server.
type admitAll struct{}

func (admitAll) Decide(_ context.Context, req decision.Request) ([]limiter.Verdict, error) {
	hits := req.Hits
	verdicts := make([]limiter.Verdict, len(hits))
	for i, h := range hits {
		verdicts[i] = limiter.Verdict{Admitted: true, Charged: true, Remaining: uint64(h.Limit) - 1, ResetAfter: h.Window}
	}
	return verdicts, nil
}

// BenchmarkShouldRateLimitNoStore is ShouldRateLimit without the store: the
// service's own CPU per request.
func BenchmarkShouldRateLimitNoStore(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(strconv.Itoa(n)+"d", func(b *testing.B) {
			s := newBenchService(b, admitAll{}, Options{})
			reqs := benchRequests("log", n)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchDecided prepares what respond takes, as ShouldRateLimit does: the
// limits matched, the hits with their keys, and verdicts.
func benchDecided(b *testing.B, s *Service, req *rlsv3.RateLimitRequest, admitted bool) ([]*limit, []limiter.Hit, []limiter.Verdict) {
	b.Helper()
	cfg := s.current.Load().config
	limits := make([]*limit, len(req.Descriptors))
	hits := make([]limiter.Hit, len(req.Descriptors))
	verdicts := make([]limiter.Verdict, len(req.Descriptors))
	var kb limiter.KeyBuilder
	for i, d := range req.Descriptors {
		l, err := resolve(cfg, req.Domain, d)
		if err != nil || l == nil {
			b.Fatalf("descriptor %d: %v, %v", i, l, err)
		}
		l.hit = i
		limits[i] = l
		hits[i] = limiter.Hit{Key: storeKey(&kb, req.Domain, d.Entries, l), Algorithm: l.algorithm,
			Limit: l.requestsPerUnit, Window: l.window(), Cost: 1}
		verdicts[i] = limiter.Verdict{Admitted: admitted, Charged: admitted, Remaining: uint64(l.requestsPerUnit) / 2,
			ResetAfter: 1500 * time.Millisecond}
	}
	return limits, hits, verdicts
}

// BenchmarkRespond is the building of Envoy's answer from the verdicts: the
// statuses, their current limits and durations, headers, metrics.
func BenchmarkRespond(b *testing.B) {
	cases := []struct {
		name     string
		n        int
		admitted bool
		opts     Options
	}{
		{"ok/1d", 1, true, Options{}},
		{"ok/3d", 3, true, Options{}},
		{"over_limit/1d", 1, false, Options{}},
		{"over_limit/3d", 3, false, Options{}},
		{"ratelimit_headers/3d", 3, true, Options{RateLimitHeaders: true}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := newBenchService(b, admitAll{}, c.opts)
			limits, hits, verdicts := benchDecided(b, s, benchRequests("counter", c.n)[0], c.admitted)
			b.ReportAllocs()
			for b.Loop() {
				s.respond("bench", limits, hits, verdicts)
			}
		})
	}
}
