package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
)

// Three requests against a limit of two per minute, on the embedded store:
// the third is denied, and told when a unit frees up.
func Example() {
	lim, err := limiter.NewEmbedded(nil)
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	perMinute := limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 2, Window: time.Minute}
	for range 3 {
		v, err := lim.Decide(context.Background(), limiter.Hit{Key: "user:42", Limit: perMinute, Cost: 1})
		if err != nil {
			panic(err)
		}
		fmt.Println(v[0].Admitted, v[0].Remaining, v[0].ResetAfter > 59*time.Second)
	}
	// Output:
	// true 1 true
	// true 0 true
	// false 0 true
}

// A Go program counting on the counter the service keeps for Envoy's
// descriptor [user_id=42] of domain "api", under the config's rule.
func ExampleKey() {
	cfg, err := config.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 100}
`), nil)
	if err != nil {
		panic(err)
	}
	entry := config.Entry{Key: "user_id", Value: "42"}
	rule, _ := cfg.Match("api", entry)
	limit, err := limiter.LimitOf(rule.Limits()[0])
	if err != nil {
		panic(err)
	}
	key, err := limiter.Key("", "api", limit, entry)
	if err != nil {
		panic(err)
	}
	fmt.Println(key)
	// Output: rl:{api|user_id=42}:counter:60
}
