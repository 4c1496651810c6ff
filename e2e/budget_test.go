package e2e

// Budgets on a real redis-server: costs reported after the response
// (Envoy's apply_on_stream_done), refunds (is_negative_hits), several limits
// on one descriptor.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const budgetConfig = `
domain: budget
descriptors:
  - key: tokens_log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window_log}
  - key: tokens_counter
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window_counter}
  - key: tokens_fixed
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}
  - key: tokens_gcra
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: gcra}
  - key: user
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 10, algorithm: sliding_window_log}
      - {name: per_day, unit: day, requests_per_unit: 1000}
`

var budgetAlgorithms = []string{"log", "counter", "fixed", "gcra"}

// withCost gives d its own hits_addend, as Envoy does for a route's
// rate_limits entry with hits_addend (apply_on_stream_done reports).
func withCost(d *rlcommon.RateLimitDescriptor, cost uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(cost)
	return d
}

// awayFromEdge waits, when the next multiple of window is less than margin
// away, until just past it: a test that must stay in one fixed window.
func awayFromEdge(window, margin time.Duration) {
	if edge := nextEdge(window); time.Until(edge) < margin {
		waitUntil(edge.Add(100 * time.Millisecond))
	}
}

// TestTokenBudgetOverdrawn: a 1000-token budget checked with hits_addend 0
// and charged after each response with the tokens used. A report past the
// budget is recorded, and the next zero-cost check is denied with an honest
// wait; for every algorithm.
func TestTokenBudgetOverdrawn(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, budgetConfig)
	ctx := context.Background()
	awayFromEdge(time.Hour, 30*time.Second)
	for _, alg := range budgetAlgorithms {
		for _, tc := range []struct {
			name    string
			reports []uint64
			stored  int64 // units the counter holds after the reports
		}{
			// The log stores at most the limit per report: they share one
			// microsecond, and 1000 there fill every window that holds them.
			{"one report of 1200", []uint64{1200}, map[string]int64{"log": 1000}[alg]},
			{"three reports of 400", []uint64{400, 400, 400}, 1200},
		} {
			t.Run(alg+"/"+tc.name, func(t *testing.T) {
				key := "tokens_" + alg
				user := fmt.Sprintf("%s-%d", alg, len(tc.reports))
				check := func() *rlcommon.RateLimitDescriptor { return withCost(descriptor(key, user), 0) }
				for i, cost := range tc.reports {
					if resp := s.ask(t, request("budget", check())); resp.OverallCode != ok {
						t.Fatalf("check before report %d: %v", i+1, resp)
					}
					s.ask(t, request("budget", withCost(descriptor(key, user), cost)))
				}
				resp := s.ask(t, request("budget", check()))
				st := resp.Statuses[0]
				if resp.OverallCode != over || st.LimitRemaining != 0 {
					t.Fatalf("check after the reports: %v, want OVER_LIMIT with nothing left", resp)
				}
				wait := st.DurationUntilReset.AsDuration()
				if wait <= 0 || wait > 2*time.Hour {
					t.Fatalf("duration_until_reset %v, want within two windows", wait)
				}
				retry, _ := headerValue(resp, "retry-after")
				if n, err := strconv.ParseInt(retry, 10, 64); err != nil || n != int64(math.Ceil(wait.Seconds())) {
					t.Fatalf("retry-after %q, want %v rounded up", retry, wait)
				}
				t.Logf("%s, %s: the check waits %v", alg, tc.name, wait)
				k := fmt.Sprintf("rl:{budget|%s=%s}:%s:3600", key, user, alg)
				stored := int64(0)
				switch alg {
				case "log":
					stored = r.client.ZCard(ctx, k).Val()
				case "gcra":
					stored = gcraOwedUnits(t, r.client, k, 1000, time.Hour)
				default:
					stored = windowCount(t, r.client, k)
				}
				want := tc.stored
				if want == 0 {
					want = 1200
				}
				if stored != want {
					t.Fatalf("%s holds %d units, want %d", k, stored, want)
				}
			})
		}
	}
	// The largest report there is: recorded, no Redis error.
	for _, alg := range budgetAlgorithms {
		resp := s.ask(t, request("budget", withCost(descriptor("tokens_"+alg, "max"), math.MaxUint64)))
		if resp.OverallCode != over {
			t.Fatalf("%s: report of 2^64-1: %v", alg, resp)
		}
		if resp := s.ask(t, request("budget", withCost(descriptor("tokens_"+alg, "max"), 0))); resp.OverallCode != over {
			t.Fatalf("%s: check after a report of 2^64-1: %v", alg, resp)
		}
	}
	if got := metric(t, s, `ratelimit_store_errors_total{kind="redis"}`); got != "" {
		t.Fatalf("Redis errors: %s", got)
	}
}

// TestRefundFreesWhatItSays: is_negative_hits gives its cost back, never
// more than was used; for every algorithm.
func TestRefundFreesWhatItSays(t *testing.T) {
	t.Parallel()
	s := startLibrary(t, startRedis(t), budgetConfig, nil)
	awayFromEdge(time.Hour, 30*time.Second)
	for _, alg := range budgetAlgorithms {
		t.Run(alg, func(t *testing.T) {
			key := "tokens_" + alg
			spend := request("budget", descriptor(key, "r"))
			spend.HitsAddend = 1000
			if resp := s.ask(t, spend); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("spending the budget: %v", resp)
			}
			if resp := s.ask(t, request("budget", withCost(descriptor(key, "r"), 0))); resp.OverallCode != over {
				t.Fatalf("check of a spent budget: %v", resp)
			}
			back := withCost(descriptor(key, "r"), 300)
			back.IsNegativeHits = true
			if resp := s.ask(t, request("budget", back)); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 300 {
				t.Fatalf("refund of 300: %v, want OK with 300 left", resp)
			}
			use := request("budget", descriptor(key, "r"))
			use.HitsAddend = 300
			if resp := s.ask(t, use); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("300 after the refund: %v", resp)
			}
			if resp := s.ask(t, use); resp.OverallCode != over {
				t.Fatalf("300 more: %v, want OVER_LIMIT: the refund freed 300, no more", resp)
			}
			back = withCost(descriptor(key, "r"), 5000)
			back.IsNegativeHits = true
			if resp := s.ask(t, request("budget", back)); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 1000 {
				t.Fatalf("refund of 5000 with 1000 used: %v, want 1000 left (never below zero)", resp)
			}
		})
	}
}

// TestRefundAndChargeInOneRequest: a request that gives 300 back to a
// budget and charges it 100 (two descriptors of one key) leaves it at used
// - 300 + 100, whichever descriptor comes first; for every algorithm.
func TestRefundAndChargeInOneRequest(t *testing.T) {
	t.Parallel()
	s := startLibrary(t, startRedis(t), budgetConfig, nil)
	awayFromEdge(time.Hour, 30*time.Second)
	for _, alg := range budgetAlgorithms {
		for _, refundFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/refund first %t", alg, refundFirst), func(t *testing.T) {
				key, value := "tokens_"+alg, fmt.Sprintf("rc-%t", refundFirst)
				spend := request("budget", descriptor(key, value))
				spend.HitsAddend = 600
				if resp := s.ask(t, spend); resp.OverallCode != ok {
					t.Fatalf("spending 600: %v", resp)
				}
				back := withCost(descriptor(key, value), 300)
				back.IsNegativeHits = true
				both := request("budget", back, descriptor(key, value)) // the second costs the request's 100
				if !refundFirst {
					both = request("budget", descriptor(key, value), back)
				}
				both.HitsAddend = 100
				if resp := s.ask(t, both); resp.OverallCode != ok {
					t.Fatalf("refund of 300 and charge of 100: %v", resp)
				}
				// GCRA refills a unit every 3.6 s meanwhile.
				resp := s.ask(t, request("budget", withCost(descriptor(key, value), 0)))
				if got := resp.Statuses[0].LimitRemaining; got != 600 && (alg != "gcra" || got != 601) {
					t.Fatalf("budget after 600 - 300 + 100: %d left, want 600", got)
				}
			})
		}
	}
}

// TestSeveralLimitsEnforceBoth: 10 per second and 1000 per day on one
// descriptor. A burst trips the second's limit while the day has room; a
// day used up denies while the second has room; the answer shows the limit
// that denies.
func TestSeveralLimitsEnforceBoth(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startLibrary(t, r, budgetConfig, nil)
	ctx := context.Background()
	awayFromEdge(24*time.Hour, 30*time.Second)

	// A burst of 11 within one second, in two calls (10 units, then 1) so
	// that a loaded machine keeps it within the second: the 11th is denied
	// by per_second. A burst that still crossed the second's edge, where
	// the second has room again, is sent again by another user, the
	// verdict judged only on a burst that kept to its second.
	var (
		resp *rlsv3.RateLimitResponse
		user string
	)
	for attempt := 1; ; attempt++ {
		awayFromEdge(time.Second, 500*time.Millisecond)
		second := time.Now().Truncate(time.Second)
		user = fmt.Sprintf("burst-%d", attempt)
		ten := request("budget", descriptor("user", user))
		ten.HitsAddend = 10
		if resp := s.ask(t, ten); resp.OverallCode != ok {
			t.Fatalf("10 units of a burst: %v", resp)
		}
		resp = s.ask(t, request("budget", descriptor("user", user)))
		if time.Now().Truncate(time.Second).Equal(second) {
			break
		}
		if attempt == 10 {
			t.Fatal("ten bursts of two calls each took past a second's edge")
		}
		t.Logf("the burst of %s crossed a second's edge: again", user)
	}
	st := resp.Statuses[0]
	if resp.OverallCode != over || st.CurrentLimit.GetName() != "per_second" {
		t.Fatalf("11th of the burst: %v, want OVER_LIMIT by per_second", resp)
	}
	if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Second {
		t.Fatalf("per_second wait %v", d)
	}
	// The denied request charged neither limit: the day counter holds 10.
	day := time.Now().Unix() / 86400
	dayKey := "rl:{budget|user=" + user + "}:counter:86400"
	if n := windowCount(t, r.client, dayKey); n != 10 {
		t.Fatalf("day counter %d, want 10", n)
	}

	// A day with 995 used: 5 more pass, spread over seconds, then the day
	// denies while the second has room.
	if err := r.client.Set(ctx, "rl:{budget|user=daily}:counter:86400", fmt.Sprintf("%d:995:0", day), 24*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		resp := s.ask(t, request("budget", descriptor("user", "daily")))
		if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetName() != "per_day" || resp.Statuses[0].LimitRemaining != uint32(4-i) {
			t.Fatalf("request %d of the day's last 5: %v, want OK shown by per_day with %d left", i+1, resp, 4-i)
		}
	}
	resp = s.ask(t, request("budget", descriptor("user", "daily")))
	st = resp.Statuses[0]
	if resp.OverallCode != over || st.CurrentLimit.GetName() != "per_day" || st.CurrentLimit.GetRequestsPerUnit() != 1000 {
		t.Fatalf("the day's 1001st: %v, want OVER_LIMIT by per_day", resp)
	}
	if d := st.DurationUntilReset.AsDuration(); d < time.Minute || d > 48*time.Hour {
		t.Fatalf("per_day wait %v", d)
	}
}

// gcraOwedUnits reads a GCRA key ("<TAT in Unix microseconds>:<remainder>")
// and returns the whole units its bucket owes now, by Redis's clock.
func gcraOwedUnits(t *testing.T, c *redis.Client, key string, limit int64, window time.Duration) int64 {
	t.Helper()
	ctx := context.Background()
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	tatText, _, _ := strings.Cut(v, ":")
	tat, err := strconv.ParseInt(tatText, 10, 64)
	if err != nil {
		t.Fatalf("%s holds %q", key, v)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	owed := time.Duration(tat-now.UnixMicro()) * time.Microsecond
	return int64(math.Ceil(float64(owed) / float64(window/time.Duration(limit))))
}
