package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const testConfig = `
domain: e2e
descriptors:
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log}
  - key: counter
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_counter}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: fast_log
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: fast_counter
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: fast_fixed
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: fixed_window}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: open
    rate_limit: {unlimited: true}
  - key: fail_deny
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: deny}
  - key: fail_allow
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: allow}
  - key: hot_log
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: sliding_window_log}
  - key: hot_counter
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: sliding_window_counter}
  - key: hot_fixed
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}
  - key: flush
    rate_limit: {unit: day, requests_per_unit: 100000, failure_mode: deny}
`

var (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestStatusesInRequestOrder(t *testing.T) {
	t.Parallel()
	s := startLibrary(t, startRedis(t), testConfig, nil)

	resp := s.ask(t, request("e2e", descriptor("log", "a"), descriptor("nope", "x"), descriptor("open", "1")))
	if resp.OverallCode != ok || len(resp.Statuses) != 3 {
		t.Fatalf("response %v", resp)
	}
	limited, unmatched, unlimited := resp.Statuses[0], resp.Statuses[1], resp.Statuses[2]
	if limited.Code != ok || limited.CurrentLimit.GetRequestsPerUnit() != 5 ||
		limited.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || limited.LimitRemaining != 4 {
		t.Fatalf("limited status %v", limited)
	}
	if d := limited.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
		t.Fatalf("duration_until_reset %v, want (0, 1m]", d)
	}
	if unmatched.Code != ok || unmatched.CurrentLimit != nil {
		t.Fatalf("unmatched status %v", unmatched)
	}
	if unlimited.Code != ok || unlimited.CurrentLimit != nil {
		t.Fatalf("unlimited status %v", unlimited)
	}
	if _, found := headerValue(resp, "retry-after"); found {
		t.Fatal("retry-after on an OK answer")
	}

	for i := 0; i < 4; i++ {
		s.ask(t, request("e2e", descriptor("log", "a")))
	}
	resp = s.ask(t, request("e2e", descriptor("open", "1"), descriptor("log", "a")))
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over {
		t.Fatalf("over-limit response %v", resp)
	}
	retry, found := headerValue(resp, "retry-after")
	if !found {
		t.Fatalf("no retry-after in %v", resp.ResponseHeadersToAdd)
	}
	secs, err := strconv.Atoi(retry)
	wait := resp.Statuses[1].DurationUntilReset.AsDuration()
	if err != nil || secs < 1 || time.Duration(secs)*time.Second < wait || time.Duration(secs-1)*time.Second >= wait {
		t.Fatalf("retry-after %q for a wait of %v, want the wait rounded up to whole seconds", retry, wait)
	}

	// An unknown domain is not limited.
	resp = s.ask(t, request("elsewhere", descriptor("log", "a")))
	if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", resp)
	}
}

// TestRetryAfterHolds: on a real Redis clock, a client retrying clearly
// before the announced wait is denied, and one retrying at it is admitted.
func TestRetryAfterHolds(t *testing.T) {
	s := startServer(t, startRedis(t), testConfig)
	for _, key := range []string{"fast_log", "fast_counter", "fast_fixed"} {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			req := request("e2e", descriptor(key, "x"))
			var a timedAnswer
			// Hits spread 150 ms apart, so that the window holds them at
			// different ages.
			pace := time.NewTicker(150 * time.Millisecond)
			for a = s.askTimed(t, req); a.resp.OverallCode == ok; a = s.askTimed(t, req) {
				<-pace.C
			}
			pace.Stop()
			wait := a.resp.Statuses[0].DurationUntilReset.AsDuration()
			if wait <= 0 || wait > 4*time.Second {
				t.Fatalf("wait %v", wait)
			}
			// The denial was decided between its send and its answer: the
			// reset comes no sooner than sent+wait, no later than came+wait.
			// Clearly before: 100ms before the soonest. An admission
			// answered after the soonest (a slow call) may be right, and
			// took the unit the reset freed: nothing more to judge.
			if early := wait - 100*time.Millisecond; early > 0 {
				waitUntil(a.sent.Add(early))
				if p := s.askTimed(t, req); p.resp.OverallCode != over {
					if p.came.Before(a.sent.Add(wait)) {
						t.Fatalf("admitted %v before the announced %v", a.sent.Add(wait).Sub(p.came), wait)
					}
					t.Logf("the early retry came back %v after the soonest reset, admitted", p.came.Sub(a.sent.Add(wait)))
					return
				}
			}
			waitUntil(a.came.Add(wait + 20*time.Millisecond))
			if resp := s.ask(t, req); resp.OverallCode != ok {
				t.Fatalf("denied after waiting the announced %v: %v", wait, resp)
			}
		})
	}
}

func TestHitsAddend(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, testConfig)

	req := request("e2e", descriptor("counter", "b"))
	req.HitsAddend = 3
	if st := s.ask(t, req).Statuses[0]; st.Code != ok || st.LimitRemaining != 2 {
		t.Fatalf("request hits_addend 3: %v", st)
	}
	// An explicit 0 on the descriptor checks without consuming.
	d := descriptor("counter", "b")
	d.HitsAddend = wrapperspb.UInt64(0)
	req = request("e2e", d)
	req.HitsAddend = 5
	if st := s.ask(t, req).Statuses[0]; st.Code != ok || st.LimitRemaining != 2 {
		t.Fatalf("descriptor hits_addend 0: %v", st)
	}
	// The descriptor's value overrides the request's.
	d.HitsAddend = wrapperspb.UInt64(1)
	if st := s.ask(t, req).Statuses[0]; st.Code != ok || st.LimitRemaining != 1 {
		t.Fatalf("descriptor hits_addend 1 under request 5: %v", st)
	}
	// More than the limit at once: denied at once, nothing written.
	big := request("e2e", descriptor("log", "big"))
	big.HitsAddend = 6
	if resp := s.ask(t, big); resp.OverallCode != over {
		t.Fatalf("cost above the limit: %v", resp)
	}
	if n := r.client.Exists(context.Background(), "rl:{e2e|log=big}:log:60").Val(); n != 0 {
		t.Fatal("a key was written for a cost above the limit")
	}
	waitFor(t, 2*time.Second, func() error {
		if !strings.Contains(s.logs.String(), "cost exceeds the limit") {
			return errNotYet
		}
		return nil
	})
}

func TestLimitOverride(t *testing.T) {
	t.Parallel()
	s := startLibrary(t, startRedis(t), testConfig, nil)
	d := descriptor("log", "o")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		st := s.ask(t, request("e2e", d)).Statuses[0]
		if st.Code != want || st.CurrentLimit.GetRequestsPerUnit() != 2 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("hit %d: %v, want %v under the 2/hour override", i, st, want)
		}
	}
	// An override in a domain the config does not know is ignored.
	if resp := s.ask(t, request("unknown", d)); resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("override in an unknown domain: %v", resp)
	}
}

func TestShadowModeNeverDenies(t *testing.T) {
	t.Parallel()
	s := startServer(t, startRedis(t), testConfig)
	for i := 0; i < 3; i++ {
		resp := s.ask(t, request("e2e", descriptor("shadow", "s"), descriptor("counter", "s")))
		if resp.OverallCode != ok || resp.Statuses[0].Code != ok {
			t.Fatalf("hit %d: %v", i, resp)
		}
		if resp.Statuses[1].LimitRemaining != uint32(4-i) {
			t.Fatalf("hit %d: enforced descriptor beside shadow one not charged: %v", i, resp.Statuses[1])
		}
	}
	waitFor(t, 2*time.Second, func() error {
		if !strings.Contains(s.logs.String(), "would deny") {
			return errNotYet
		}
		return nil
	})
}

func TestBadInputIsInvalidArgument(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, testConfig, "--max-descriptors", "3", "--max-entries", "2")
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", request("", descriptor("log", "a")), "domain is empty"},
		{"no descriptors", request("e2e"), "no descriptors"},
		{"empty key", request("e2e", descriptor("", "a")), "descriptor 0 entry 0 has an empty key"},
		{"too many descriptors", request("e2e", descriptor("log", "a"), descriptor("log", "a"), descriptor("log", "a"), descriptor("log", "a")),
			"request has more than the limit of 3 descriptors"},
		{"too many entries", request("e2e", descriptor("a", "1", "b", "2", "c", "3")), "descriptor 0 has more than the limit of 2 entries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.rls.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("error %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
	// Several refused requests carry descriptors that match a rule (log=a):
	// a check done per descriptor instead of per request would write them.
	if n := r.client.DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("%d keys written by refused requests", n)
	}
}

// TestConcurrentClientsAdmitExactlyTheLimit: 200 clients race for one key.
func TestConcurrentClientsAdmitExactlyTheLimit(t *testing.T) {
	r := startRedis(t)
	s := startServer(t, r, testConfig)
	// The rules use day windows; a run across midnight UTC would see two.
	avoidMidnight(t, 30*time.Second)
	for _, key := range []string{"hot_log", "hot_counter", "hot_fixed"} {
		t.Run(key, func(t *testing.T) {
			const clients, perClient, limit = 200, 3, 100
			var admitted, denied, failed atomic.Int64
			var wg sync.WaitGroup
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < perClient; i++ {
						resp, err := s.rls.ShouldRateLimit(context.Background(), request("e2e", descriptor(key, "one")))
						switch {
						case err != nil:
							failed.Add(1)
						case resp.OverallCode == ok:
							admitted.Add(1)
						default:
							denied.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%s: %d admitted, %d denied, %d errors", key, admitted.Load(), denied.Load(), failed.Load())
			if admitted.Load() != limit || failed.Load() != 0 {
				t.Fatalf("admitted %d with %d errors, want exactly %d and none", admitted.Load(), failed.Load(), limit)
			}
		})
	}
	if strings.Contains(s.logs.String(), "store unavailable") {
		t.Fatal("a failure mode answered during the run")
	}
}

// TestScriptFlushMidRun: Redis forgets the decide code while requests flow;
// the service loads it again and no request notices.
func TestScriptFlushMidRun(t *testing.T) {
	r := startRedis(t)
	s := startServer(t, r, testConfig)
	loadsBefore := codeLoads(t, r.client)
	const clients, perClient = 20, 50
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	stop, flusherDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flusherDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				// A flush that fails is a flush the service never faced.
				if err := flushCode(context.Background(), r.client); err != nil {
					t.Errorf("flushing the code: %v", err)
				}
			}
		}
	}()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perClient; i++ {
				resp, err := s.rls.ShouldRateLimit(context.Background(), request("e2e", descriptor("flush", "f")))
				if err != nil {
					failed.Add(1)
				} else if resp.OverallCode == ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-flusherDone
	if admitted.Load() != clients*perClient || failed.Load() != 0 {
		t.Fatalf("admitted %d of %d with %d errors: a flush reached a client (the rule fails closed)",
			admitted.Load(), clients*perClient, failed.Load())
	}
	if strings.Contains(s.logs.String(), "store unavailable") {
		t.Fatal("a failure mode answered during the run")
	}
	// The flushes did bite: the code was loaded again.
	if loads := codeLoads(t, r.client); loads <= loadsBefore {
		t.Fatalf("the decide code was loaded %d times before the flushes and %d after: no flush bit", loadsBefore, loads)
	}
}

func TestFailureModes(t *testing.T) {
	t.Parallel()
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		r := startRedis(t)
		s := startServer(t, r, testConfig, "--store-timeout", "200ms", "--grpc-server", kind)
		r.stop()
		start := time.Now()
		resp := s.ask(t, request("e2e", descriptor("fail_deny", "x"), descriptor("fail_allow", "x"), descriptor("open", "x")))
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("answer took %v with the store down", took)
		}
		if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok || resp.Statuses[2].Code != ok {
			t.Fatalf("store down: %v, want deny, allow, unlimited", resp)
		}
		if retry, _ := headerValue(resp, "retry-after"); retry != "1" {
			t.Fatalf("retry-after %q, want 1", retry)
		}
		s.waitLog(t, "store unavailable")
	})
}

func TestGracefulShutdown(t *testing.T) {
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		s := startServer(t, startRedis(t), testConfig, "--shutdown-delay", "1s", "--grpc-server", kind)
		s.ask(t, request("e2e", descriptor("log", "g")))
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// During the delay: still answering, but saying it is going away.
		waitFor(t, 900*time.Millisecond, func() error {
			h, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			if h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
				return fmt.Errorf("health %v", h.Status)
			}
			return nil
		})
		if resp, err := http.Get("http://" + s.httpAddr + "/readyz"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz while draining: %v %v, want 503", resp, err)
		}
		s.ask(t, request("e2e", descriptor("log", "g")))
		waitCleanExit(t, s.exited)
	})
}

func TestEmbeddedStore(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil, testConfig)
	// fixed admits 5 in a fixed window of a minute: six hits in one.
	want := []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, ok, over}
	got := inOneWindow(t, time.Minute, func(attempt int) []rlsv3.RateLimitResponse_Code {
		var got []rlsv3.RateLimitResponse_Code
		for range want {
			got = append(got, s.ask(t, request("e2e", descriptor("fixed", attemptValue("e", attempt)))).OverallCode)
		}
		return got
	})
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("hit %d: %v, want %v", i, got[i], want[i])
		}
	}
	s.waitLog(t, "embedded store")
}

func TestValidateCommand(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(binary, "validate", "--config", filepath.Join("..", "examples", "config")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("validate the example config: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	out, err = exec.Command(binary, "validate", "--config", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bad.yaml:4") || !strings.Contains(string(out), "fortnight") {
		t.Fatalf("validate a bad config: err %v\n%s", err, out)
	}
}
