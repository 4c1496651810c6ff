package service

import (
	"fmt"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// shadowConfig has fixed windows, as the reference counts: on the test's
// frozen clock, the start of a minute, every reset is 60 s away.
const shadowConfig = `
domain: svc
descriptors:
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: pair
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
`

// render shows an answer on one line: the overall code, each status (code,
// requests_per_unit, limit_remaining, duration_until_reset) and the headers.
func render(resp *rlsv3.RateLimitResponse) string {
	parts := []string{resp.OverallCode.String()}
	for _, st := range resp.Statuses {
		parts = append(parts, fmt.Sprintf("[%v %d %d %v]", st.Code, st.CurrentLimit.GetRequestsPerUnit(), st.LimitRemaining,
			st.DurationUntilReset.AsDuration()))
	}
	for _, h := range resp.ResponseHeadersToAdd {
		parts = append(parts, h.Key+":"+h.Value)
	}
	return strings.Join(parts, " ")
}

// TestShadowAnswers: the reference's answers under its global SHADOW_MODE
// (each status as it would be, the overall code OK, no retry-after) and
// for a rule's own shadow_mode (its status OK with 0 remaining, which the
// headers may show), request by request; the global shadow_mode metric
// counts the requests only the global mode let through.
func TestShadowAnswers(t *testing.T) {
	headers := func(limit, remaining, reset int) string {
		return fmt.Sprintf("RateLimit-Limit:%d RateLimit-Remaining:%d RateLimit-Reset:%d", limit, remaining, reset)
	}
	for _, tc := range []struct {
		name   string
		global bool
		ask    []*rlcommon.RateLimitDescriptor // asked three times
		want   []string
		// the reference's global_shadow_mode and its rate_limit_shadow_mode of "trial"
		globalShadow, ruleShadow float64
	}{
		{"global: one over, one under", true, []*rlcommon.RateLimitDescriptor{desc("small", "a"), desc("big", "a")}, []string{
			"OK [OK 1 0 1m0s] [OK 5 4 1m0s] " + headers(1, 0, 60),
			// Denied only by small, which keeps its status; big is charged.
			"OK [OVER_LIMIT 1 0 1m0s] [OK 5 3 1m0s] " + headers(1, 0, 60),
			"OK [OVER_LIMIT 1 0 1m0s] [OK 5 2 1m0s] " + headers(1, 0, 60),
		}, 2, 0},
		{"global: the last denial shows", true, []*rlcommon.RateLimitDescriptor{desc("small", "a"), desc("pair", "a")}, []string{
			"OK [OK 1 0 1m0s] [OK 2 1 1m0s] " + headers(1, 0, 60),
			"OK [OVER_LIMIT 1 0 1m0s] [OK 2 0 1m0s] " + headers(1, 0, 60),
			"OK [OVER_LIMIT 1 0 1m0s] [OVER_LIMIT 2 0 1m0s] " + headers(2, 0, 60),
		}, 2, 0},
		{"global: within every limit", true, []*rlcommon.RateLimitDescriptor{desc("big", "a")}, []string{
			"OK [OK 5 4 1m0s] " + headers(5, 4, 60),
			"OK [OK 5 3 1m0s] " + headers(5, 3, 60),
			"OK [OK 5 2 1m0s] " + headers(5, 2, 60),
		}, 0, 0},
		{"rule: over its limit, OK with 0 remaining, the tightest", false, []*rlcommon.RateLimitDescriptor{desc("big", "a"), desc("trial", "a")}, []string{
			"OK [OK 5 4 1m0s] [OK 1 0 1m0s] " + headers(1, 0, 60),
			"OK [OK 5 3 1m0s] [OK 1 0 1m0s] " + headers(1, 0, 60),
			"OK [OK 5 2 1m0s] [OK 1 0 1m0s] " + headers(1, 0, 60),
		}, 0, 2},
		{"rule beside an enforced denial", false, []*rlcommon.RateLimitDescriptor{desc("trial", "a"), desc("small", "a")}, []string{
			"OK [OK 1 0 1m0s] [OK 1 0 1m0s] " + headers(1, 0, 60),
			"OVER_LIMIT [OK 1 0 1m0s] [OVER_LIMIT 1 0 1m0s] retry-after:60 " + headers(1, 0, 60),
			"OVER_LIMIT [OK 1 0 1m0s] [OVER_LIMIT 1 0 1m0s] retry-after:60 " + headers(1, 0, 60),
		}, 0, 2},
		{"global and rule", true, []*rlcommon.RateLimitDescriptor{desc("trial", "a"), desc("small", "a")}, []string{
			"OK [OK 1 0 1m0s] [OK 1 0 1m0s] " + headers(1, 0, 60),
			"OK [OK 1 0 1m0s] [OVER_LIMIT 1 0 1m0s] " + headers(1, 0, 60),
			"OK [OK 1 0 1m0s] [OVER_LIMIT 1 0 1m0s] " + headers(1, 0, 60),
		}, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s, _ := serveRules(t, shadowConfig, &Options{ShadowMode: tc.global, RateLimitHeaders: true, Metrics: metrics.New(reg)})
			for i, want := range tc.want {
				if got := render(ask(t, s, tc.ask...)); got != want {
					t.Errorf("request %d:\n got %s\nwant %s", i+1, got, want)
				}
			}
			if got := counterSum(t, reg, "ratelimit_service_global_shadow_mode"); got != tc.globalShadow {
				t.Errorf("global_shadow_mode %v, want %v", got, tc.globalShadow)
			}
			if got := counterSum(t, reg, "ratelimit_service_rate_limit_shadow_mode"); got != tc.ruleShadow {
				t.Errorf("rate_limit_shadow_mode %v, want %v", got, tc.ruleShadow)
			}
		})
	}
}

// TestGlobalShadowCountsWhatWouldBeDenied: this service's own decision
// metric still calls a denial under --shadow-mode a shadow_would_deny.
func TestGlobalShadowCountsWhatWouldBeDenied(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _ := serveRules(t, shadowConfig, &Options{ShadowMode: true, Metrics: metrics.New(reg)})
	for range 3 {
		ask(t, s, desc("small", "a"))
	}
	got := outcomes(t, reg)
	if got["small shadow_would_deny"] != 2 || got["small near_limit"] != 1 || got["small over_limit"] != 0 {
		t.Fatalf("decisions %v, want 1 near_limit (1 of 1 used) and 2 shadow_would_deny", got)
	}
}

// counterSum is the sum of a counter's series.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
