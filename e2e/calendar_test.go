package e2e

// Calendar windows on a real redis-server: fixed windows of months and
// weeks, in a named time zone, whose counts, expiries and resets follow
// Redis TIME to the calendar's edges.

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

const calendarConfig = `
domain: calendar
descriptors:
  - key: tokens
    rate_limit: {unit: month, requests_per_unit: 1000, algorithm: fixed_window, time_zone: Europe/Berlin}
  - key: weekly
    rate_limit: {unit: week, requests_per_unit: 5, algorithm: fixed_window}
`

// TestCalendarBudgetOnRedis: the service binary on redis-server answers a
// monthly budget in Berlin and a weekly one in UTC with MONTH and WEEK,
// and with the time to the next first of the month in Berlin and to the
// next Monday as duration_until_reset and retry-after; each counter's TTL
// on Redis ends there too. The edges are weeks away: TestCalendarEdgeOnRedis
// crosses one.
func TestCalendarBudgetOnRedis(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, calendarConfig)
	ctx := context.Background()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key, value string
		limit            uint32
		unit             rlsv3.RateLimitResponse_RateLimit_Unit
		edge             func(now time.Time) time.Time
		redisKey         string
	}{
		{"month in Berlin", "tokens", "alice", 1000, rlsv3.RateLimitResponse_RateLimit_MONTH,
			func(now time.Time) time.Time {
				y, m, _ := now.In(berlin).Date()
				return time.Date(y, m+1, 1, 0, 0, 0, 0, berlin)
			}, "rl:{calendar|tokens=alice}:fixed:1mo@Europe/Berlin"},
		{"week", "weekly", "bob", 5, rlsv3.RateLimitResponse_RateLimit_WEEK,
			func(now time.Time) time.Time {
				y, m, d := now.UTC().Date()
				monday := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
				return monday.AddDate(0, 0, 7-(int(monday.Weekday())+6)%7)
			}, "rl:{calendar|weekly=bob}:fixed:7d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A second away from an edge, both answers below fall in one window.
			if now := time.Now(); tc.edge(now).Sub(now) < 2*time.Second {
				waitUntil(tc.edge(now).Add(100 * time.Millisecond))
			}
			spend := descriptor(tc.key, tc.value)
			req := request("calendar", spend)
			req.HitsAddend = tc.limit
			before := time.Now()
			resp := s.ask(t, req)
			want := tc.edge(before).Sub(before)
			// Each reading is what was left to the edge when it was taken:
			// at most want, at least what is left once it has come back,
			// give or take slack. Slow calls on a busy machine move both.
			left := func(got, slack time.Duration) bool {
				return got <= want+slack && got >= time.Until(tc.edge(before))-slack
			}
			st := resp.Statuses[0]
			if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit.Unit != tc.unit || st.LimitRemaining != 0 ||
				!left(st.DurationUntilReset.AsDuration(), time.Second) {
				t.Fatalf("spending the budget: %v; want OK, %v, 0 remaining, reset in %v", st, tc.unit, want)
			}
			resp = s.ask(t, request("calendar", descriptor(tc.key, tc.value)))
			st = resp.Statuses[0]
			retry, _ := headerValue(resp, "retry-after")
			seconds, _ := strconv.Atoi(retry)
			if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || !left(st.DurationUntilReset.AsDuration(), time.Second) ||
				!left(time.Duration(seconds)*time.Second, 2*time.Second) {
				t.Fatalf("one more: %v, retry-after %q; want OVER_LIMIT until %v from now", st, retry, want)
			}
			ttl, err := r.client.PTTL(ctx, tc.redisKey).Result()
			if err != nil || !left(ttl, time.Second) {
				t.Fatalf("PTTL %s = %v, %v; want %v", tc.redisKey, ttl, err, want)
			}
			t.Logf("%s: reset in %v (to %v), retry-after %ss, TTL %v", tc.name, st.DurationUntilReset.AsDuration(),
				tc.edge(before).UTC(), retry, ttl)
		})
	}
}

// TestCalendarEdgeOnRedis crosses a month's first instant on redis-server:
// a month is long, so the calendar's zone is one made for the test, whose
// first of the month at midnight is three seconds away (an offset of up to a
// month: Go's time zones take any). The limiter is the service's, in this
// process, with the real clock; Redis TIME picks the window. A budget spent
// before the edge is denied until it, with a reset and a key TTL of what
// is left to it, and is whole at the edge, then reset at the end of the
// next month, as long as that month is in that zone.
func TestCalendarEdgeOnRedis(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	lim := limiter.New(r.client, &limiter.Options{Timeout: 10 * time.Second, DenyCache: -1})
	t.Cleanup(lim.Close)
	ctx := context.Background()

	edge := time.Now().Add(3 * time.Second).Truncate(time.Second)
	first := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC) // the wall clock the zone shows at edge
	zone := time.FixedZone("e2e", int(first.Unix()-edge.Unix()))
	cal := config.Calendar{Months: 1, Zone: zone}
	if got := cal.Edges(edge)[1]; !got.Equal(edge) {
		t.Fatalf("the zone's month starts at %v, want %v", got, edge)
	}
	var kb limiter.KeyBuilder
	kb.Reset("calendar")
	kb.Add("tokens", "carol")
	h := limiter.Hit{Key: kb.CalendarKey(config.FixedWindow, cal), Algorithm: config.FixedWindow, Limit: 100,
		Window: config.Month.Duration(), Calendar: cal, Cost: 100, FailureMode: config.FailureDeny}
	// decide returns h's verdict, and the reset it must give: the edge (or
	// end) less Redis TIME, which is between the call's start and its end.
	decide := func(end time.Time) (v limiter.Verdict, least, most time.Duration) {
		t.Helper()
		before := time.Now()
		vs, err := lim.Decide(ctx, []limiter.Hit{h})
		if err != nil {
			t.Fatal(err)
		}
		return vs[0], time.Until(end), end.Sub(before)
	}
	v, least, most := decide(edge)
	if !v.Admitted || !v.Charged || v.Remaining != 0 || v.ResetAfter < least || v.ResetAfter > most {
		t.Fatalf("spending the budget: %+v, want admitted, reset in %v to %v", v, least, most)
	}
	h.Cost = 1
	if v, least, most := decide(edge); least > 0 && (v.Admitted || v.ResetAfter < least || v.ResetAfter > most) {
		t.Fatalf("one more: %+v, want denied until the edge, in %v to %v", v, least, most)
	}
	// Redis rounds the TTL up to the millisecond, and its clock for expiry
	// is a cached one, updated once per event loop: on a busy machine it
	// lagged 12 ms. A tenth of a second of slack still tells the edge from
	// anything else (the next edge is a month on).
	// What is left is taken before PTTL is sent: once it has come back,
	// less is left than Redis saw.
	before := time.Now()
	if ttl, err := r.client.PTTL(ctx, h.Key).Result(); err != nil || ttl <= 0 || ttl > edge.Sub(before)+100*time.Millisecond {
		t.Fatalf("PTTL = %v, %v; want what is left to the edge, %v", ttl, err, edge.Sub(before))
	}
	waitUntil(edge.Add(-300 * time.Millisecond))
	if v, least, _ := decide(edge); least > 0 && v.Admitted {
		t.Fatalf("before the edge: %+v, want still denied", v)
	}
	waitUntil(edge.Add(50 * time.Millisecond))
	end := edge.Add(31 * 24 * time.Hour) // the zone's March
	v, least, most = decide(end)
	if !v.Admitted || v.Remaining != 99 || v.ResetAfter < least || v.ResetAfter > most {
		t.Fatalf("after the edge: %+v, want admitted, 99 remaining, reset at the end of the zone's March, in %v to %v", v, least, most)
	}
	t.Logf("after the edge (%v late): %d remaining, reset in %v", time.Since(edge), v.Remaining, v.ResetAfter)
}
