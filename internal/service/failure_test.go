package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// failureConfig has one rule per failure mode, a shadow rule that defers, and
// a rule the store is still able to decide in storeDown (over_*: over limit).
const failureConfig = `
domain: fm
descriptors:
  - key: deny
    rate_limit: {unit: minute, requests_per_unit: 10, failure_mode: deny}
  - key: allow
    rate_limit: {unit: minute, requests_per_unit: 10, failure_mode: allow}
  - key: unset
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow_unset
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: over
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// storeDown is a Decider whose store cannot decide, as the limiter reports
// it: an error wrapping limiter.ErrStore, and each hit answered by its
// failure mode (deny: denied with limiter.FailureRetry; allow and defer:
// admitted, nothing charged, the whole limit left). Hits on keys containing
// "over=" stand for a slot that did answer: over the limit, 30 s to wait.
type storeDown struct{}

func (storeDown) Decide(_ context.Context, req decision.Request) ([]limiter.Verdict, error) {
	hits := req.Hits
	verdicts := make([]limiter.Verdict, len(hits))
	failed := false
	for i, h := range hits {
		switch {
		case strings.Contains(h.Key, "|over="):
			verdicts[i] = limiter.Verdict{ResetAfter: 30 * time.Second}
		case h.FailureMode == config.FailureDeny:
			verdicts[i], failed = limiter.Verdict{FailureVerdict: true, ResetAfter: limiter.FailureRetry}, true
		default:
			verdicts[i], failed = limiter.Verdict{FailureVerdict: true, Admitted: true, Remaining: uint64(h.Limit)}, true
		}
	}
	if !failed {
		return verdicts, nil
	}
	return verdicts, fmt.Errorf("%w: decide: dial tcp: connection refused", limiter.ErrStore)
}

func newFailureService(t *testing.T, d Decider, opts *Options) (*Service, *prometheus.Registry) {
	t.Helper()
	cfg, err := config.Parse("fm.yaml", []byte(failureConfig), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o := Options{}
	if opts != nil {
		o = *opts
	}
	o.Metrics = metrics.New(reg)
	return New(cfg, d, &o), reg
}

// outcomes returns the ratelimit_decisions_total counts by "rule outcome".
func outcomes(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "ratelimit_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["rule"]+" "+labels["outcome"]] += m.GetCounter().GetValue()
		}
	}
	return got
}

func TestStoreDownFailureModes(t *testing.T) {
	type want struct {
		code     codes.Code                     // of the call
		overall  rlsv3.RateLimitResponse_Code   // when OK
		statuses []rlsv3.RateLimitResponse_Code // when OK
		retry    string                         // retry-after, when OVER_LIMIT
		outcomes map[string]float64             // decisions counted
	}
	const (
		okCode = rlsv3.RateLimitResponse_OK
		over   = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	for _, tt := range []struct {
		name  string
		rules []string // one descriptor per rule, in this order
		want  want
	}{
		{"allow alone", []string{"allow"}, want{codes.OK, okCode, []rlsv3.RateLimitResponse_Code{okCode}, "",
			map[string]float64{"allow failure_allow": 1}}},
		{"deny alone", []string{"deny"}, want{codes.OK, over, []rlsv3.RateLimitResponse_Code{over}, "1",
			map[string]float64{"deny failure_deny": 1}}},
		{"unset alone", []string{"unset"}, want{code: codes.Unavailable,
			outcomes: map[string]float64{"unset failure_defer": 1}}},
		{"deny and allow", []string{"deny", "allow"}, want{codes.OK, over, []rlsv3.RateLimitResponse_Code{over, okCode}, "1",
			map[string]float64{"deny failure_deny": 1, "allow failure_allow": 1}}},
		{"deny wins over unset", []string{"unset", "deny"}, want{codes.OK, over, []rlsv3.RateLimitResponse_Code{okCode, over}, "1",
			map[string]float64{"unset failure_defer": 1, "deny failure_deny": 1}}},
		{"unset wins over allow", []string{"allow", "unset"}, want{code: codes.Unavailable,
			outcomes: map[string]float64{"allow failure_allow": 1, "unset failure_defer": 1}}},
		{"all three: deny wins", []string{"allow", "unset", "deny"}, want{codes.OK, over, []rlsv3.RateLimitResponse_Code{okCode, okCode, over}, "1",
			map[string]float64{"allow failure_allow": 1, "unset failure_defer": 1, "deny failure_deny": 1}}},
		// Another slot answered OVER_LIMIT: the request is refused whatever
		// the failed slot would have said, with the real wait.
		{"a real denial wins over unset", []string{"unset", "over"}, want{codes.OK, over, []rlsv3.RateLimitResponse_Code{okCode, over}, "30",
			map[string]float64{"unset failure_defer": 1, "over over_limit": 1}}},
		// A shadow rule never limits, so it never fails a request either.
		{"shadow unset", []string{"shadow_unset", "allow"}, want{codes.OK, okCode, []rlsv3.RateLimitResponse_Code{okCode, okCode}, "",
			map[string]float64{"shadow_unset failure_defer": 1, "allow failure_allow": 1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, reg := newFailureService(t, storeDown{}, nil)
			req := &rlsv3.RateLimitRequest{Domain: "fm"}
			for _, r := range tt.rules {
				req.Descriptors = append(req.Descriptors, desc(r, "x"))
			}
			resp, err := s.ShouldRateLimit(context.Background(), req)
			if got := status.Code(err); got != tt.want.code {
				t.Fatalf("code %v (%v), want %v", got, err, tt.want.code)
			}
			if err != nil {
				if resp != nil || !strings.Contains(err.Error(), "no failure_mode") {
					t.Fatalf("error %v with answer %v, want no answer and a message naming the cause", err, resp)
				}
			} else {
				if resp.OverallCode != tt.want.overall || len(resp.Statuses) != len(tt.want.statuses) {
					t.Fatalf("answer %v, want overall %v", resp, tt.want.overall)
				}
				for i, st := range resp.Statuses {
					if st.Code != tt.want.statuses[i] {
						t.Errorf("status %d (%s): %v, want %v", i, tt.rules[i], st.Code, tt.want.statuses[i])
					}
				}
				retry, _ := headerOf(resp, "retry-after")
				if retry != tt.want.retry {
					t.Errorf("retry-after %q, want %q", retry, tt.want.retry)
				}
			}
			got := outcomes(t, reg)
			if len(got) != len(tt.want.outcomes) {
				t.Errorf("outcomes %v, want %v", got, tt.want.outcomes)
			}
			for k, v := range tt.want.outcomes {
				if got[k] != v {
					t.Errorf("outcome %q counted %v, want %v (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

func headerOf(resp *rlsv3.RateLimitResponse, key string) (string, bool) {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// TestGlobalShadowNeverDefers: with --shadow-mode every answer is OK, a
// store outage included.
func TestGlobalShadowNeverDefers(t *testing.T) {
	s, _ := newFailureService(t, storeDown{}, &Options{ShadowMode: true})
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("unset", "x"), desc("deny", "x")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("shadow mode, store down: %v %v, want OK", resp, err)
	}
}

// TestDefaultFailureModeApplies: Defaults.FailureMode (the
// --default-failure-mode flag) gives rules without failure_mode an answer of
// their own, so nothing defers to Envoy.
func TestDefaultFailureModeApplies(t *testing.T) {
	for _, tt := range []struct {
		mode config.FailureMode
		want rlsv3.RateLimitResponse_Code
	}{
		{config.FailureAllow, rlsv3.RateLimitResponse_OK},
		{config.FailureDeny, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		cfg, err := config.Parse("fm.yaml", []byte(failureConfig), config.Defaults{FailureMode: tt.mode})
		if err != nil {
			t.Fatal(err)
		}
		s := New(cfg, storeDown{}, nil)
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("unset", "x")}})
		if err != nil || resp.OverallCode != tt.want {
			t.Errorf("default %v: %v %v, want %v", tt.mode, resp, err, tt.want)
		}
	}
}

// TestJSONStoreDown: POST /json answers 503 where gRPC answers UNAVAILABLE,
// 429 for a failure_mode deny, 200 for allow.
func TestJSONStoreDown(t *testing.T) {
	for _, tt := range []struct {
		decider Decider
		rule    string
		want    int
	}{
		{storeDown{}, "unset", http.StatusServiceUnavailable},
		{storeDown{}, "deny", http.StatusTooManyRequests},
		{storeDown{}, "allow", http.StatusOK},
		{overloaded{}, "unset", http.StatusServiceUnavailable},
	} {
		s, _ := newFailureService(t, tt.decider, nil)
		body := `{"domain":"fm","descriptors":[{"entries":[{"key":"` + tt.rule + `","value":"x"}]}]}`
		rec := httptest.NewRecorder()
		s.JSONHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/json", strings.NewReader(body)))
		if rec.Code != tt.want {
			t.Errorf("%T %s: HTTP %d %q, want %d", tt.decider, tt.rule, rec.Code, rec.Body.String(), tt.want)
		}
	}
}

// TestLimiterStoreDownDefers: the real limiter against a store that is gone
// gives verdicts the service turns into UNAVAILABLE for a rule without
// failure_mode, alone or beside an allow rule, and OVER_LIMIT beside a deny
// rule.
func TestLimiterStoreDownDefers(t *testing.T) {
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	m.Close()
	s, _ := newFailureService(t, decision.Direct(l), nil)
	for _, ds := range [][]*rlcommon.RateLimitDescriptor{
		{desc("unset", "x")},
		{desc("allow", "x"), desc("unset", "x")},
	} {
		_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm", Descriptors: ds})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%d descriptors, store gone: %v, want UNAVAILABLE", len(ds), err)
		}
	}
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("unset", "x"), desc("deny", "x")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("deny and unset, store gone: %v %v, want OVER_LIMIT", resp, err)
	}
}

// overloaded is a Decider that never got to ask the store in time.
type overloaded struct{}

func (overloaded) Decide(_ context.Context, req decision.Request) ([]limiter.Verdict, error) {
	hits := req.Hits
	verdicts := make([]limiter.Verdict, len(hits))
	for i, h := range hits {
		verdicts[i] = limiter.Verdict{FailureVerdict: true, Admitted: h.FailureMode != config.FailureDeny}
	}
	return verdicts, fmt.Errorf("decide: %w: context deadline exceeded", limiter.ErrOverloaded)
}

// TestOverloadIsNotAStoreFailure: a request whose deadline passed before
// the store was asked fails, for a rule without failure_mode, with
// RESOURCE_EXHAUSTED (this instance was too slow), not UNAVAILABLE (the
// store was); a deny rule still denies.
func TestOverloadIsNotAStoreFailure(t *testing.T) {
	s, _ := newFailureService(t, overloaded{}, nil)
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("unset", "x")}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("overloaded, rule without failure_mode: %v, want RESOURCE_EXHAUSTED", err)
	}
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("unset", "x"), desc("deny", "x")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("overloaded, deny and unset: %v %v, want OVER_LIMIT", resp, err)
	}
}

// mixedFailure is a Decider whose request spans two slot groups: one was
// overloaded, the other met a store failure.
type mixedFailure struct{}

func (mixedFailure) Decide(ctx context.Context, req decision.Request) ([]limiter.Verdict, error) {
	verdicts, _ := overloaded{}.Decide(ctx, req)
	return verdicts, errors.Join(
		fmt.Errorf("decide: %w: context deadline exceeded", limiter.ErrOverloaded),
		fmt.Errorf("%w: decide: dial tcp: connection refused", limiter.ErrStore))
}

// TestAStoreFailureBesideAnOverloadIsUnavailable: when any slot group met a
// store failure, the store is at fault, whatever the other groups met.
func TestAStoreFailureBesideAnOverloadIsUnavailable(t *testing.T) {
	s, _ := newFailureService(t, mixedFailure{}, nil)
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fm",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("unset", "x")}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("overload in one group, store failure in another: %v, want UNAVAILABLE", err)
	}
}
