package ratelimittest_test

import (
	"context"
	"fmt"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/pkg/ratelimittest"
)

// The way a user's test uses it: a config string, a client, answers.
func TestStart(t *testing.T) {
	srv := ratelimittest.Start(t, `
domain: checkout
descriptors:
  - key: customer
    rate_limit: {unit: hour, requests_per_unit: 2}
`, nil)
	client := srv.Client(t)
	req := &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "customer", Value: "c1"}},
	}}}
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.OverallCode)
	}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	if len(codes) != 3 || codes[0] != want[0] || codes[1] != want[1] || codes[2] != want[2] {
		t.Errorf("codes %v, want %v", codes, want)
	}
}

// A config that does not load fails the test with its line.
func TestStartBadConfig(t *testing.T) {
	fake := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }() // fake.Fatalf stops here, as FailNow stops a test
		ratelimittest.Start(fake, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", nil)
	}()
	if want := "ratelimittest: ratelimittest.yaml:4: unknown unit"; len(fake.fatal) < len(want) || fake.fatal[:len(want)] != want {
		t.Errorf("Fatalf got %q, want it to start with %q", fake.fatal, want)
	}
}

type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic("fatal")
}
