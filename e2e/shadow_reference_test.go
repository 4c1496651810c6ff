package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// shadowCompareConfig has a rule per unit the windows reset at, and one in
// shadow mode of its own.
const shadowCompareConfig = `domain: shadow
descriptors:
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 3}
`

// shadowStep is a request of a comparison, and the statuses the reference
// answers it with (for the reader: the answers are compared whole).
type shadowStep struct {
	hitsAddend uint32
	ask        []*rlcommon.RateLimitDescriptor
	statuses   []rlsv3.RateLimitResponse_Code
}

// shadowSeries is a counter both replicas' /metrics are to hold.
type shadowSeries struct {
	name   string
	labels []string
	want   float64
}

// TestShadowModeAnswersAsTheReference: envoyproxy/ratelimit itself and this
// service, each started with the same reference environment (SHADOW_MODE
// and LIMIT_RESPONSE_HEADERS_ENABLED on) and config, each on a Redis of its
// own, answer one sequence of requests alike, descriptor by descriptor:
// codes, current_limit, limit_remaining, duration_until_reset (within a
// second and the time between the two calls), the overall code and the
// headers (RateLimit-Reset likewise), and count the requests only SHADOW_MODE let through alike.
func TestShadowModeAnswersAsTheReference(t *testing.T) {
	t.Parallel()
	d := descriptor
	compareWithReference(t, "true", []shadowStep{
		{0, []*rlcommon.RateLimitDescriptor{d("small", "a"), d("big", "a")}, []rlsv3.RateLimitResponse_Code{ok, ok}},
		{0, []*rlcommon.RateLimitDescriptor{d("small", "a"), d("big", "a"), d("trial", "a")}, []rlsv3.RateLimitResponse_Code{ok, ok, ok}},
		// small over its limit; trial over its own, in shadow mode; no rule for none.
		{0, []*rlcommon.RateLimitDescriptor{d("trial", "a"), d("small", "a"), d("none", "x")}, []rlsv3.RateLimitResponse_Code{ok, over, ok}},
		{2, []*rlcommon.RateLimitDescriptor{d("big", "a"), d("daily", "d")}, []rlsv3.RateLimitResponse_Code{ok, ok}},
		{0, []*rlcommon.RateLimitDescriptor{d("daily", "d"), d("big", "a"), d("trial", "b")}, []rlsv3.RateLimitResponse_Code{ok, over, ok}},
		{0, []*rlcommon.RateLimitDescriptor{d("daily", "d"), d("small", "b")}, []rlsv3.RateLimitResponse_Code{over, ok}},
		{0, []*rlcommon.RateLimitDescriptor{d("trial", "b")}, []rlsv3.RateLimitResponse_Code{ok}},
		// Two denials: the headers show the last.
		{0, []*rlcommon.RateLimitDescriptor{d("small", "a"), d("daily", "d")}, []rlsv3.RateLimitResponse_Code{over, over}},
	}, []shadowSeries{
		// Four requests were let through by SHADOW_MODE alone; trial, in
		// shadow mode of its own, went over its limit twice.
		{"ratelimit_service_global_shadow_mode", nil, 4},
		{"ratelimit_service_rate_limit_shadow_mode", []string{`domain="shadow"`, `key1="trial"`}, 2},
		{"ratelimit_service_rate_limit_over_limit", []string{`domain="shadow"`, `key1="small"`}, 2},
	})
}

// TestShadowRuleAnswersAsTheReference: without SHADOW_MODE, a rule's own
// shadow_mode answers as in the reference: OK with 0 remaining over its
// limit, which the headers show.
func TestShadowRuleAnswersAsTheReference(t *testing.T) {
	t.Parallel()
	d := descriptor
	compareWithReference(t, "false", []shadowStep{
		{0, []*rlcommon.RateLimitDescriptor{d("big", "c"), d("trial", "c")}, []rlsv3.RateLimitResponse_Code{ok, ok}},
		{0, []*rlcommon.RateLimitDescriptor{d("big", "c"), d("trial", "c")}, []rlsv3.RateLimitResponse_Code{ok, ok}},
		{0, []*rlcommon.RateLimitDescriptor{d("trial", "c"), d("small", "c")}, []rlsv3.RateLimitResponse_Code{ok, ok}},
	}, []shadowSeries{
		{"ratelimit_service_rate_limit_shadow_mode", []string{`domain="shadow"`, `key1="trial"`}, 2},
	})
}

// compareWithReference starts envoyproxy/ratelimit and this service with
// the reference's environment, SHADOW_MODE=shadowMode, on a Redis each,
// asks both each step's request in turn, compares the answers (overall
// code OK throughout), then the counters of series on both /metrics pages.
func compareWithReference(t *testing.T, shadowMode string, steps []shadowStep, series []shadowSeries) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "config.yaml"), shadowCompareConfig)
	env := func(r *redisServer) (map[string]string, string) {
		prom := "127.0.0.1:" + strconv.Itoa(freePort(t))
		return map[string]string{
			"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": r.addr, "USE_STATSD": "false", "LOG_LEVEL": "info",
			"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
			"RUNTIME_IGNOREDOTFILES": "true", "SHADOW_MODE": shadowMode, "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
			"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": prom, "STATS_FLUSH_INTERVAL": "100ms",
		}, prom
	}
	refEnv, refProm := env(startRedis(t))
	ref := startUpstream(t, refEnv)
	oursEnv, oursProm := env(startRedis(t))
	ours := startReference(t, oursEnv)
	ref.waitHealthcheck(t, http.StatusOK)
	ours.waitHealthcheck(t, http.StatusOK)

	// Every window edge (minute, hour, day) is a minute's edge: the
	// sequence, a second or two long, is not to straddle one.
	if edge := nextEdge(time.Minute); time.Until(edge) < 20*time.Second {
		waitUntil(edge)
	}
	for i, step := range steps {
		req := request("shadow", step.ask...)
		req.HitsAddend = step.hitsAddend
		asked := time.Now()
		want, got := ref.ask(t, req), ours.ask(t, req)
		between := time.Since(asked) // the two clocks read the reset this far apart, at most
		if want.OverallCode != ok || len(want.Statuses) != len(step.statuses) {
			t.Fatalf("request %d: the reference answers %v", i+1, want)
		}
		for j, st := range want.Statuses {
			if st.Code != step.statuses[j] {
				t.Fatalf("request %d: the reference's status %d is %v, want %v: %v", i+1, j, st.Code, step.statuses[j], want)
			}
		}
		sameAnswer(t, i+1, want, got, between)
	}

	// The reference's counters reach its Prometheus page at its next stats flush.
	for _, s := range series {
		for _, prom := range []string{refProm, oursProm} {
			waitFor(t, 15*time.Second, func() error {
				_, body := httpGet(t, "http://"+prom+"/metrics")
				if got := sampleSum(t, body, s.name, s.labels...); got != s.want {
					return fmt.Errorf("%s: %s%v is %v, want %v", prom, s.name, s.labels, got, s.want)
				}
				return nil
			})
		}
	}
}

// sameAnswer fails the test where got, this service's answer to request n,
// differs from want, the reference's. The resets may differ by a second
// (the reference rounds to whole seconds) plus between, the time from the
// reference's call to the end of this service's: each is read from its own
// clock when its call runs, and a busy machine can part the two calls.
func sameAnswer(t *testing.T, n int, want, got *rlsv3.RateLimitResponse, between time.Duration) {
	t.Helper()
	slack := time.Second + between
	if got.OverallCode != want.OverallCode || len(got.Statuses) != len(want.Statuses) {
		t.Fatalf("request %d:\n got %v\nwant %v", n, got, want)
	}
	for j, w := range want.Statuses {
		g := got.Statuses[j]
		if g.Code != w.Code || !proto.Equal(g.CurrentLimit, w.CurrentLimit) || g.LimitRemaining != w.LimitRemaining ||
			(g.DurationUntilReset == nil) != (w.DurationUntilReset == nil) ||
			absDiff(g.DurationUntilReset.AsDuration(), w.DurationUntilReset.AsDuration()) > slack {
			t.Errorf("request %d, status %d:\n got %v\nwant %v", n, j, g, w)
		}
	}
	if len(got.ResponseHeadersToAdd) != len(want.ResponseHeadersToAdd) {
		t.Errorf("request %d: headers\n got %v\nwant %v", n, got.ResponseHeadersToAdd, want.ResponseHeadersToAdd)
	}
	for _, w := range want.ResponseHeadersToAdd {
		g, present := headerValue(got, w.Key)
		same := present && g == w.Value
		if w.Key == "RateLimit-Reset" {
			gs, gErr := strconv.Atoi(g)
			ws, wErr := strconv.Atoi(w.Value)
			same = present && gErr == nil && wErr == nil && absDiff(time.Duration(gs)*time.Second, time.Duration(ws)*time.Second) <= slack
		}
		if !same {
			t.Errorf("request %d: header %s %q, want %q", n, w.Key, g, w.Value)
		}
	}
}

func absDiff(a, b time.Duration) time.Duration {
	if a > b {
		return a - b
	}
	return b - a
}

// ask is ShouldRateLimit on a replica, failing the test on an error.
func (r *referenceReplica) ask(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.rls.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}
