package e2e

import (
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const remainingConfig = `
domain: another
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: fixed_window}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: sliding_window_log}
  - key: counter
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: sliding_window_counter}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: gcra}
`

// TestReferenceRemainingWithSlices runs envoyproxy/ratelimit's integration
// case on remaining (a fresh key2 value hit 25 times in a row under 20 a
// minute: OK with 19 down to 0 remaining, then OVER_LIMIT with 0) through
// one instance at its default flags, hot-key slices on, for each
// algorithm: the hits it decides from a slice answer as Redis would have.
// A run that crossed a window's edge (or, for GCRA, took a unit's time, 3
// s) is not the case: it is run again on a fresh value.
func TestReferenceRemainingWithSlices(t *testing.T) {
	t.Parallel()
	s := startServer(t, startRedis(t), remainingConfig)
	for _, key := range []string{"fixed", "log", "counter", "gcra"} {
		t.Run(key, func(t *testing.T) {
			for try := 0; ; try++ {
				value := fmt.Sprintf("%d-%d", time.Now().UnixNano(), try)
				start := time.Now()
				var wrong string
				for i := range 25 {
					resp := s.ask(t, request("another", descriptor(key, value)))
					want, remaining := rlsv3.RateLimitResponse_OK, uint32(20-(i+1))
					if i >= 20 {
						want, remaining = rlsv3.RateLimitResponse_OVER_LIMIT, 0
					}
					st := resp.Statuses[0]
					if resp.OverallCode != want || st.LimitRemaining != remaining {
						wrong += fmt.Sprintf("\nhit %d: %v, remaining %d; want %v, %d", i+1, resp.OverallCode, st.LimitRemaining, want, remaining)
					}
				}
				end := time.Now()
				crossed := start.Truncate(time.Minute) != end.Truncate(time.Minute) || key == "gcra" && end.Sub(start) >= 3*time.Second
				if wrong == "" {
					break
				}
				if !crossed || try == 3 {
					t.Fatalf("answers unlike envoyproxy/ratelimit's:%s", wrong)
				}
			}
		})
	}
	if local := metricSum(t, s, "ratelimit_hot_key_local_hits_total"); local == 0 {
		t.Fatal("no hit decided from a slice: the case tests nothing")
	} else {
		t.Logf("%v hits decided from slices", local)
	}
}
