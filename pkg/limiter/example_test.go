package limiter_test

import (
	"context"
	"fmt"
	"time"

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
// descriptor (domain "api", entry user_id=42) under a rule of 100 requests
// per minute with the default algorithm.
func ExampleKey() {
	key := limiter.Key("", "api", limiter.Limit{Requests: 100, Window: time.Minute},
		limiter.Entry{Key: "user_id", Value: "42"})
	fmt.Println(key)
	// Output: rl:{api|user_id=42}:counter:60
}
