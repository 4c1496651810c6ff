package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

const burstConfig = `
domain: burst
descriptors:
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: counter
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: gcra}
`

// burstResult counts the answers of a burst.
type burstResult struct {
	admitted, denied atomic.Int64
	errors           sync.Map // codes.Code to *atomic.Int64
}

func (b *burstResult) failed(code codes.Code) {
	n, _ := b.errors.LoadOrStore(code, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

func (b *burstResult) errorCount() int64 {
	var total int64
	b.errors.Range(func(_, n any) bool { total += n.(*atomic.Int64).Load(); return true })
	return total
}

func (b *burstResult) String() string {
	s := fmt.Sprintf("%d admitted, %d denied", b.admitted.Load(), b.denied.Load())
	b.errors.Range(func(code, n any) bool {
		s += fmt.Sprintf(", %d %v", n.(*atomic.Int64).Load(), code)
		return true
	})
	return s
}

// burst sends requests from callers concurrent callers, spread over the
// servers, all at descriptor key=value, each with deadline.
func burst(servers []*server, callers, requests int, deadline time.Duration, key, value string) *burstResult {
	var res burstResult
	var wg sync.WaitGroup
	start := make(chan struct{})
	for c := range callers {
		s := servers[c%len(servers)]
		wg.Go(func() {
			<-start
			for range requests / callers {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				resp, err := s.rls.ShouldRateLimit(ctx, request("burst", descriptor(key, value)))
				cancel()
				switch {
				case err != nil:
					res.failed(status.Code(err))
				case resp.OverallCode == ok:
					res.admitted.Add(1)
				default:
					res.denied.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return &res
}

// TestBurstAtOneKeyAdmitsExactlyTheLimit: 200 concurrent callers send 2000
// requests at one descriptor whose limit is 3, on 1 and on 3 instances of
// the service at their default flags: exactly 3 are admitted, every other
// request is answered OVER_LIMIT, and none is an error (which Envoy would
// let through). On each gRPC server.
func TestBurstAtOneKeyAdmitsExactlyTheLimit(t *testing.T) {
	t.Parallel() // what it asserts holds at any speed
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		r := startRedis(t)
		servers := []*server{
			startServer(t, r, burstConfig, "--grpc-server", kind),
			startServer(t, r, burstConfig, "--grpc-server", kind),
			startServer(t, r, burstConfig, "--grpc-server", kind),
		}
		avoidHourEdge(t, 30*time.Second)
		for _, instances := range []int{1, 3} {
			for _, key := range []string{"log", "counter", "fixed", "gcra"} {
				t.Run(fmt.Sprintf("%d instances/%s", instances, key), func(t *testing.T) {
					res := burst(servers[:instances], 200, 2000, 5*time.Second, key, fmt.Sprint("on-", instances))
					t.Logf("%s", res)
					if res.admitted.Load() != 3 || res.errorCount() != 0 {
						t.Fatalf("%s: want exactly 3 admitted and no errors", res)
					}
				})
			}
		}
		noFailureMode(t, servers...)
	})
}

// TestBurstWithEnvoyDeadlines: the same burst with Envoy's default 20 ms
// deadline, on the service built without the race detector (whose slowdown
// would miss every deadline). An error or a missed deadline is a request
// Envoy lets through; on a shared machine some deadlines are missed, which
// is measured by make bench, not asserted here. What the
// service guarantees holds at any speed: never more than the limit answered
// OK (the rules name no failure_mode, so a request the service could not
// decide in time is an error, never an OK), and every error a missed
// deadline, an overload refusal, or a store call that outlived its deadline.
// On each gRPC server.
func TestBurstWithEnvoyDeadlines(t *testing.T) {
	t.Parallel() // what it asserts holds at any speed
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		r := startRedis(t)
		s := startPlainServer(t, r, burstConfig, "--grpc-server", kind)
		avoidHourEdge(t, 30*time.Second)
		for _, key := range []string{"log", "counter", "fixed", "gcra"} {
			t.Run(key, func(t *testing.T) {
				res := burst([]*server{s}, 200, 2000, 20*time.Millisecond, key, "envoy")
				t.Logf("%s (Envoy would let %d through: the limit is 3)", res, res.admitted.Load()+res.errorCount())
				if res.admitted.Load() > 3 {
					t.Fatalf("%s: more than the limit of 3 answered OK", res)
				}
				res.errors.Range(func(code, _ any) bool {
					switch c := code.(codes.Code); c {
					case codes.DeadlineExceeded, codes.ResourceExhausted, codes.Unavailable:
					default:
						t.Errorf("%s: an error %v; want only missed deadlines, overload refusals and late store calls", res, c)
					}
					return true
				})
			})
		}
	})
}

// avoidHourEdge waits for the next hour when fewer than margin are left, so
// that a fixed window does not restart during a test.
func avoidHourEdge(t *testing.T, margin time.Duration) {
	t.Helper()
	if edge := nextEdge(time.Hour); time.Until(edge) < margin {
		t.Logf("waiting %v for the hour to pass", time.Until(edge)+time.Second)
		waitUntil(edge.Add(time.Second))
	}
}

var (
	plainOnce  sync.Once
	plainPath  string
	plainError error
)

// plainBinary is the service built without the race detector, once, for
// the tests whose figures the detector's slowdown or memory would distort.
// It is built as the image's is (CGO_ENABLED=0, -trimpath: the Dockerfile's
// line, which deploy's TestImage runs), so that the two builds share their
// compiled packages instead of compiling every dependency twice.
func plainBinary(t *testing.T) string {
	t.Helper()
	plainOnce.Do(func() {
		plainPath = filepath.Join(filepath.Dir(binary), "ratelimit-plain")
		build := exec.Command("go", "build", "-trimpath", "-o", plainPath, "../cmd/ratelimit")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		if err != nil {
			plainError = fmt.Errorf("building the service without -race: %v\n%s", err, out)
		}
	})
	if plainError != nil {
		t.Fatal(plainError)
	}
	return plainPath
}

// startPlainServer is startServer on the binary built without the race
// detector (plainBinary).
func startPlainServer(t *testing.T, r *redisServer, configYAML string, extra ...string) *server {
	t.Helper()
	s := startProcessOf(t, plainBinary(t), r, configYAML, insecure.NewCredentials(), extra...)
	s.waitHealth(t, healthpb.HealthCheckResponse_SERVING)
	return s
}
