package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// quotaConfig has a quota descriptor with two limits (api), another quota
// descriptor (backup) and an ordinary one (user).
const quotaConfig = `domain: quota
descriptors:
  - key: api
    quota_mode: true
    rate_limits:
      - {unit: second, requests_per_unit: 2, algorithm: fixed_window}
      - {unit: day, requests_per_unit: 100, algorithm: fixed_window}
  - key: backup
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1, algorithm: fixed_window}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}
`

// TestQuotaDescriptorOverChargesNone: a quota descriptor with one limit
// over and the other fitting is answered OVER_LIMIT and charges neither; the
// request passes when another quota fits, and charges nothing when none
// does. On one Redis (the Functions library), with the per-second limit on
// a store of its own (Split), and on a Cluster, where each descriptor's
// counters hash to a slot of their own.
func TestQuotaDescriptorOverChargesNone(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"redis", "persecond", "cluster"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var s *server
			var count func(key string) int64
			flags := []string{"--hot-key-threshold", "0"}
			switch store {
			case "cluster":
				c := startCluster(t)
				s = startServer(t, nil, quotaConfig, append(flags, "--redis-cluster-url", c.url())...)
				count = func(key string) int64 { return c.usage(t, key) }
			default:
				r := startRedis(t)
				if store == "persecond" {
					flags = append(flags, "--redis-persecond-url", "redis://"+startRedis(t).addr)
				}
				s = startServer(t, r, quotaConfig, flags...)
				count = func(key string) int64 { return windowCount(t, r.client, key) }
			}
			avoidMidnight(t, 30*time.Second)
			// The requests of an attempt share one second, api's window.
			for attempt := 0; ; attempt++ {
				waitUntil(nextEdge(time.Second))
				edge := time.Now().Truncate(time.Second)
				if quotaAttempt(t, s, count, fmt.Sprint(attempt)) {
					return
				}
				if time.Since(edge) < 900*time.Millisecond {
					t.Fatal("wrong answers within one second")
				}
				if attempt == 3 {
					t.Fatal("no attempt fit in one second")
				}
				t.Logf("attempt %d crossed a second's edge: again", attempt)
			}
		})
	}
}

// quotaAttempt spends api's per-second limit, then asks for api, backup and
// user twice: backup fits the first time only. It reports whether the
// answers and counts were the ones wanted; a mismatch fails t unless a
// second's edge may explain it.
func quotaAttempt(t *testing.T, s *server, count func(key string) int64, value string) bool {
	t.Helper()
	day := func(key string) string { return "rl:{quota|" + key + "=" + value + "}:fixed:86400" }
	spend := request("quota", descriptor("api", value))
	spend.HitsAddend = 2
	s.ask(t, spend)
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	for i, want := range []struct {
		codes             []rlsv3.RateLimitResponse_Code // overall, api, backup, user
		api, backup, user int64                          // the day counts after it
	}{
		{[]rlsv3.RateLimitResponse_Code{ok, over, ok, ok}, 2, 1, 1},     // backup fits
		{[]rlsv3.RateLimitResponse_Code{over, over, over, ok}, 2, 1, 1}, // every quota over
	} {
		resp := s.ask(t, request("quota", descriptor("api", value), descriptor("backup", value), descriptor("user", value)))
		got := []rlsv3.RateLimitResponse_Code{resp.OverallCode}
		for _, st := range resp.Statuses {
			got = append(got, st.Code)
		}
		if !slices.Equal(got, want.codes) {
			t.Logf("request %d: codes %v, want %v", i+1, got, want.codes)
			return false
		}
		// A refund across slots or stores lands in the background.
		var counts []int64
		for range 50 {
			counts = []int64{count(day("api")), count(day("backup")), count(day("user"))}
			if slices.Equal(counts, []int64{want.api, want.backup, want.user}) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !slices.Equal(counts, []int64{want.api, want.backup, want.user}) {
			t.Errorf("request %d: day counts api, backup, user %v, want %d %d %d", i+1, counts, want.api, want.backup, want.user)
			return true // a count is no matter of a second's edge
		}
	}
	return true
}
