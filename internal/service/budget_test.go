package service

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

const budgetConfig = `
domain: b
descriptors:
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: never
    rate_limit: {unit: hour, requests_per_unit: 1000, record_costs: never}
  - key: always
    rate_limit: {unit: hour, requests_per_unit: 1000, record_costs: always}
  - key: user
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 3}
      - {name: per_day, unit: day, requests_per_unit: 5, algorithm: sliding_window_log}
  - key: vip
    rate_limit: {name: vip, unit: day, requests_per_unit: 100, replaces: [{name: per_second}]}
`

// budgetService serves budgetConfig from a miniredis with a frozen clock.
func budgetService(t *testing.T, d config.Defaults) (*Service, *miniredis.Miniredis) {
	t.Helper()
	return budgetServiceWith(t, d, -1)
}

func budgetServiceWith(t *testing.T, d config.Defaults, denyCache time.Duration) (*Service, *miniredis.Miniredis) {
	t.Helper()
	cfg, err := config.Parse("budget.yaml", []byte(budgetConfig), d)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	m.SetTime(time.Unix(1_700_006_400, 0))
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: denyCache})
	t.Cleanup(l.Close)
	return New(cfg, decision.Direct(l), nil), m
}

// costDesc is a descriptor with its own hits_addend, as Envoy sends a route
// rate_limits entry's hits_addend (apply_on_stream_done reports among them).
func costDesc(cost uint64, kv ...string) *rlcommon.RateLimitDescriptor {
	d := desc(kv...)
	d.HitsAddend = wrapperspb.UInt64(cost)
	return d
}

func askB(t *testing.T, s *Service, hitsAddend uint32, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "b", Descriptors: ds, HitsAddend: hitsAddend})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestTwoPhaseTokenBudget is Envoy Gateway's cost.request 0 / cost.response
// pattern: a check with hits_addend 0, then the tokens used, reported after
// the response with the descriptor's hits_addend.
func TestTwoPhaseTokenBudget(t *testing.T) {
	s, _ := budgetService(t, config.Defaults{})
	if r := askB(t, s, 0, costDesc(0, "tokens", "alice")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("check of an unused budget: %v", r)
	}
	if r := askB(t, s, 0, costDesc(1200, "tokens", "alice")); r.OverallCode != over {
		t.Fatalf("report of 1200 on 1000: %v, want OVER_LIMIT (recorded, the budget overdrawn)", r)
	}
	r := askB(t, s, 0, costDesc(0, "tokens", "alice"))
	if r.OverallCode != over || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("check after the report: %v, want OVER_LIMIT", r)
	}
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > 2*time.Hour {
		t.Fatalf("duration_until_reset %v", d)
	}
	if v, _ := headerOf(r, "retry-after"); v == "" {
		t.Fatalf("no retry-after: %v", r)
	}
	// Another user's budget is untouched.
	if r := askB(t, s, 0, costDesc(0, "tokens", "bob")); r.OverallCode != ok {
		t.Fatalf("bob: %v", r)
	}
}

// TestWhichCostsAreRecorded: record_costs, and the global default.
// TestDeniedChecksAreCached: a check of a spent budget (the descriptor's
// hits_addend 0) is answered from the deny cache, while every report
// reaches the store.
func TestDeniedChecksAreCached(t *testing.T) {
	s, m := budgetServiceWith(t, config.Defaults{}, time.Minute)
	askB(t, s, 0, costDesc(1200, "tokens", "c"))
	askB(t, s, 0, costDesc(0, "tokens", "c"))
	before := m.CommandCount()
	if r := askB(t, s, 0, costDesc(0, "tokens", "c")); r.OverallCode != over || m.CommandCount() != before {
		t.Fatalf("second check: %v after %d store commands, want OVER_LIMIT from the cache", r.OverallCode, m.CommandCount()-before)
	}
	askB(t, s, 0, costDesc(1200, "tokens", "c"))
	if m.CommandCount() == before {
		t.Fatal("a report was answered without the store")
	}
}

func TestWhichCostsAreRecorded(t *testing.T) {
	for _, tt := range []struct {
		name     string
		defaults config.Defaults
		key      string
		request  uint32 // request-level hits_addend of the report
		desc     bool   // the report's cost in the descriptor's own hits_addend
		recorded bool
	}{
		{"descriptor cost, default", config.Defaults{}, "tokens", 0, true, true},
		{"request cost, default", config.Defaults{}, "tokens", 1200, false, false},
		{"descriptor cost, rule never", config.Defaults{}, "never", 0, true, false},
		{"request cost, rule always", config.Defaults{}, "always", 1200, false, true},
		{"request cost, global always", config.Defaults{RecordCosts: config.RecordAllCosts}, "tokens", 1200, false, true},
		{"descriptor cost, global never", config.Defaults{RecordCosts: config.RecordNoCosts}, "tokens", 0, true, false},
		{"descriptor cost, global never, rule always", config.Defaults{RecordCosts: config.RecordNoCosts}, "always", 0, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := budgetService(t, tt.defaults)
			report := desc(tt.key, "k")
			if tt.desc {
				report = costDesc(1200, tt.key, "k")
			}
			askB(t, s, tt.request, report)
			want := ok
			if tt.recorded {
				want = over
			}
			if r := askB(t, s, 0, costDesc(0, tt.key, "k")); r.OverallCode != want {
				t.Fatalf("check after a report of 1200: %v, want %v", r.OverallCode, want)
			}
		})
	}
}

// TestNegativeHitsRefund: is_negative_hits gives the cost back.
func TestNegativeHitsRefund(t *testing.T) {
	s, _ := budgetService(t, config.Defaults{})
	askB(t, s, 0, costDesc(1000, "never", "n"))
	if r := askB(t, s, 0, desc("never", "n")); r.OverallCode != over {
		t.Fatalf("budget spent: %v", r)
	}
	back := costDesc(300, "never", "n")
	back.IsNegativeHits = true
	r := askB(t, s, 0, back)
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 300 {
		t.Fatalf("refund of 300: %v, want OK with 300 remaining", r)
	}
	if r := askB(t, s, 300, desc("never", "n")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("300 after the refund: %v", r)
	}
	// The request-level hits_addend is the refund's size when the
	// descriptor gives none.
	back = desc("never", "n")
	back.IsNegativeHits = true
	if r := askB(t, s, 50, back); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 50 {
		t.Fatalf("refund of the request's 50: %v", r)
	}
}

// TestSeveralLimitsOnOneDescriptor: every limit is enforced, all or
// nothing, and the answer shows the tightest.
func TestSeveralLimitsOnOneDescriptor(t *testing.T) {
	s, m := budgetService(t, config.Defaults{})
	now := time.Unix(1_700_006_400, 0)
	for i := range 3 {
		r := askB(t, s, 0, desc("user", "u"))
		if r.OverallCode != ok || r.Statuses[0].CurrentLimit.GetName() != "per_second" || r.Statuses[0].LimitRemaining != uint32(2-i) {
			t.Fatalf("request %d: %v, want OK shown by per_second with %d left", i+1, r, 2-i)
		}
	}
	r := askB(t, s, 0, desc("user", "u"))
	if r.OverallCode != over || r.Statuses[0].CurrentLimit.GetName() != "per_second" {
		t.Fatalf("fourth in a second: %v, want OVER_LIMIT by per_second", r)
	}
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > 2*time.Second {
		t.Fatalf("wait %v, want within two seconds (a sliding counter)", d)
	}
	// The denied request charged neither limit: 2 of the 5 per day are left.
	m.SetTime(now.Add(2 * time.Second))
	for i := range 2 {
		if r := askB(t, s, 0, desc("user", "u")); r.OverallCode != ok || r.Statuses[0].CurrentLimit.GetName() != "per_day" {
			t.Fatalf("request %d of the next second: %v, want OK shown by per_day (the tightest)", i+1, r)
		}
	}
	m.SetTime(now.Add(4 * time.Second))
	r = askB(t, s, 0, desc("user", "u"))
	if r.OverallCode != over || r.Statuses[0].CurrentLimit.GetName() != "per_day" {
		t.Fatalf("sixth of the day: %v, want OVER_LIMIT by per_day", r)
	}
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d < 23*time.Hour {
		t.Fatalf("wait %v, want the day's", d)
	}
	if v, _ := headerOf(r, "retry-after"); v != "86396" {
		t.Fatalf("retry-after %q, want 86396", v)
	}
	// A rule that replaces one limit of the group leaves the other.
	r = askB(t, s, 0, desc("user", "w"), desc("vip", "w"))
	if r.Statuses[0].CurrentLimit.GetName() != "per_day" {
		t.Fatalf("user beside vip: %v, want only per_day", r.Statuses[0])
	}
}
