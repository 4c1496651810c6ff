package service

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

const calendarRules = `
domain: c
descriptors:
  - key: tokens
    rate_limit: {unit: month, requests_per_unit: 1000, algorithm: fixed_window, time_zone: Europe/Berlin}
  - key: weekly
    rate_limit: {unit: week, requests_per_unit: 5, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: month, requests_per_unit: 5}
`

// calendarService serves calendarRules with the service's and the
// limiter's clock and Redis TIME all frozen at *now.
func calendarService(t *testing.T, now *time.Time) (*Service, *miniredis.Miniredis) {
	t.Helper()
	cfg, err := config.Parse("calendar.yaml", []byte(calendarRules), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	m.SetTime(*now)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	clock := func() time.Time { return *now }
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1, Now: clock})
	t.Cleanup(l.Close)
	return New(cfg, decision.Direct(l), &Options{Now: clock}), m
}

func askCalendar(t *testing.T, s *Service, hits uint32, d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "c",
		Descriptors: []*rlcommon.RateLimitDescriptor{d}, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0]
}

// TestMonthlyBudgetResetsOnTheFirst: a monthly budget in Berlin, spent on
// the last evening of March, answers MONTH, the time to 1 April 00:00 in
// Berlin as its reset (and retry-after), and is whole again then; its
// counter is named by its calendar and zone.
func TestMonthlyBudgetResetsOnTheFirst(t *testing.T) {
	now := time.Date(2026, 3, 31, 21, 0, 0, 0, time.UTC) // 23:00 in Berlin (CEST)
	s, m := calendarService(t, &now)
	st := askCalendar(t, s, 1000, desc("tokens", "alice"))
	if st.Code != ok || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MONTH || st.LimitRemaining != 0 ||
		st.DurationUntilReset.AsDuration() != time.Hour {
		t.Fatalf("spending the budget: %v, want OK, MONTH, 0 remaining, reset in 1h", st)
	}
	key := "rl:{c|tokens=alice}:fixed:1mo@Europe/Berlin"
	if ttl := m.TTL(key); ttl != time.Hour {
		t.Errorf("%s: TTL %v, want 1h (keys: %v)", key, ttl, m.Keys())
	}
	now = now.Add(59*time.Minute + 59*time.Second)
	m.SetTime(now)
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "c",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("tokens", "alice")}})
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.Statuses[0]; st.Code != over || st.DurationUntilReset.AsDuration() != time.Second || headerValue(resp, "retry-after") != "1" {
		t.Fatalf("a second before April in Berlin: %v, retry-after %q; want OVER_LIMIT for 1s", st, headerValue(resp, "retry-after"))
	}
	now = now.Add(time.Second)
	m.SetTime(now)
	st = askCalendar(t, s, 1, desc("tokens", "alice"))
	if april := 30 * 24 * time.Hour; st.Code != ok || st.LimitRemaining != 999 || st.DurationUntilReset.AsDuration() != april {
		t.Fatalf("April in Berlin: %v, want OK, 999 remaining, reset in 30 days", st)
	}
}

// TestWeeklyAndOverrideCalendars: a week answers WEEK and ends on Monday,
// 00:00 UTC; a monthly override of a fixed_window rule counts calendar
// months too; a sliding month is 30 days long, as before, whatever the
// calendar says.
func TestWeeklyAndOverrideCalendars(t *testing.T) {
	now := time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC) // Sunday
	s, m := calendarService(t, &now)
	st := askCalendar(t, s, 5, desc("weekly", "bob"))
	if st.Code != ok || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_WEEK || st.DurationUntilReset.AsDuration() != time.Hour {
		t.Fatalf("weekly: %v, want OK, WEEK, reset in 1h", st)
	}
	d := desc("weekly", "carol")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MONTH}
	st = askCalendar(t, s, 3, d)
	if st.Code != ok || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MONTH || st.DurationUntilReset.AsDuration() != 24*time.Hour+time.Hour {
		t.Fatalf("monthly override: %v, want OK, MONTH, reset at 1 December", st)
	}
	if !m.Exists("rl:{c|weekly=carol}:fixed:1mo") {
		t.Errorf("no calendar month counter for the override: %v", m.Keys())
	}
	st = askCalendar(t, s, 5, desc("sliding", "dave"))
	if st.Code != ok || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MONTH || !m.Exists("rl:{c|sliding=dave}:counter:2592000") {
		t.Fatalf("sliding month: %v, keys %v; want OK, MONTH, a window of 30 days", st, m.Keys())
	}
}
