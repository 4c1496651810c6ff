package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// swapConfig has the reference's rules, naming no algorithm.
const swapConfig = `domain: swap
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 10}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 10}
`

// swapEnv is the environment both replicas get, as one Deployment's pods
// do before and after its image changes.
func swapEnv(redisAddr, root string) map[string]string {
	return map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr, "USE_STATSD": "false", "LOG_LEVEL": "info",
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
	}
}

// swapCode asks replica r about one descriptor of domain swap.
func swapCode(t *testing.T, r *referenceReplica, key, value string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	return r.ask(t, request("swap", descriptor(key, value))).OverallCode
}

// TestSwapSharesCounters: envoyproxy/ratelimit itself (startUpstream) and
// this service started with the same environment and config (no
// algorithm named) on one redis-server, as during a Deployment's rolling
// update. Counts the reference made before this service started still
// count; requests spread over both admit exactly the limit, per minute,
// hour, day, week and month (the reference's: 7 and 30 days from the Unix
// epoch, which reference_fixed_window keeps); and the only keys in Redis
// are the reference's own.
func TestSwapSharesCounters(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	root := t.TempDir()
	configMapDir(t, root, "config.yaml", swapConfig)
	up := startUpstream(t, swapEnv(r.addr, root))
	up.waitHealthcheck(t, http.StatusOK)
	// Every request below falls in one day (a replica starts in between).
	awayFromEdge(24*time.Hour, time.Minute)
	day := strconv.FormatInt(time.Now().Unix()/86400*86400, 10)

	// Before the swap: 3 of the day's 5 used on the reference.
	for i := range 3 {
		if got := swapCode(t, up, "day", "before"); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d on the reference alone: %v", i+1, got)
		}
	}
	ours := startReference(t, swapEnv(r.addr, root))
	ours.waitHealthcheck(t, http.StatusOK)
	for i, want := range []rlsv3.RateLimitResponse_Code{
		rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT,
	} {
		if got := swapCode(t, ours, "day", "before"); got != want {
			t.Fatalf("request %d on this service after the reference's 3 of 5: %v, want %v", i+1, got, want)
		}
	}
	if got := swapCode(t, up, "day", "before"); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the reference after the day's 5: %v, want OVER_LIMIT", got)
	}

	// During the swap: requests alternate over both replicas, in one minute,
	// hence one hour.
	awayFromEdge(time.Minute, 15*time.Second)
	now := time.Now().Unix()
	replicas := []*referenceReplica{up, ours}
	limits := map[string]int{"minute": 10, "hour": 10, "day": 5, "week": 10, "month": 10}
	for _, key := range slices.Sorted(maps.Keys(limits)) {
		limit := limits[key]
		var answers []rlsv3.RateLimitResponse_Code
		for i := range 2 * limit {
			answers = append(answers, swapCode(t, replicas[i%2], key, "spread"))
		}
		for i, got := range answers {
			if want := i < limit; (got == rlsv3.RateLimitResponse_OK) != want {
				t.Fatalf("%s (limit %d): answers %v; want the first %d OK and the rest OVER_LIMIT", key, limit, answers, limit)
			}
		}
	}

	// The keys are the reference's: CACHE_KEY_PREFIX (none), domain, entry,
	// window start; ours never wrote one of its own.
	start := func(unit int64) string { return strconv.FormatInt(now/unit*unit, 10) }
	want := []string{
		"swap_day_before_" + day, "swap_day_spread_" + day,
		"swap_hour_spread_" + start(3600), "swap_minute_spread_" + start(60),
		"swap_month_spread_" + start(30*86400), "swap_week_spread_" + start(7*86400),
	}
	keys, err := r.client.Keys(context.Background(), "*").Result()
	slices.Sort(keys)
	if err != nil || !slices.Equal(keys, want) {
		t.Fatalf("keys in Redis %q (%v), want the reference's %q", keys, err, want)
	}
	// The reference counts its denied hits too (its
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false), this service never.
	for key, count := range map[string]string{
		want[0]: fmt.Sprint(5 + 1), // 3 and 1 denied on the reference, 2 here
		want[1]: fmt.Sprint(5 + 2), // of the 5 denials, 2 on the reference (requests 7 and 9)
		want[2]: fmt.Sprint(10 + 5),
		want[3]: fmt.Sprint(10 + 5),
		want[4]: fmt.Sprint(10 + 5),
		want[5]: fmt.Sprint(10 + 5),
	} {
		if got, err := r.client.Get(context.Background(), key).Result(); err != nil || got != count {
			t.Errorf("%s holds %q (%v), want %s", key, got, err, count)
		}
	}
}
