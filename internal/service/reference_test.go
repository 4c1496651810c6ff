package service

import (
	"context"
	"slices"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	adminv1 "github.com/slidingwindow/ratelimit/proto/ratelimit/admin/v1"
)

// referenceTestConfig is loaded with reference_fixed_window the default, as
// the reference's environment makes it.
const referenceTestConfig = `
domain: ref
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: files*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_counter}
`

// TestReferenceKeysBuilt: rules naming no algorithm count on the
// reference's keys, named by the service's clock (Options.Now) and
// --key-prefix; share_threshold entries by their pattern, an override's by
// the values; others keep this service's keys.
func TestReferenceKeysBuilt(t *testing.T) {
	cfg, err := config.Parse("ref.yaml", []byte(referenceTestConfig), config.Defaults{Algorithm: config.ReferenceFixedWindow})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	now := time.Unix(1_700_006_400+90*60+5, 0) // 1:30:05 into an hour that starts at 1_700_006_400
	m.SetTime(now)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	s := New(cfg, decision.Direct(l), &Options{KeyPrefix: "pre_", Now: func() time.Time { return now }})
	for _, tc := range []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		key   string
		value string
	}{
		{"one entry", &rlsv3.RateLimitRequest{Domain: "ref", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "alice")}},
			"pre_ref_user_alice_1700010000", "1"},
		{"share_threshold", &rlsv3.RateLimitRequest{Domain: "ref", Descriptors: []*rlcommon.RateLimitDescriptor{desc("path", "files/a", "method", "GET")}},
			"pre_ref_path_files*_method_GET_1700011800", "1"},
		{"share_threshold, another value", &rlsv3.RateLimitRequest{Domain: "ref",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("path", "files/b", "method", "GET")}}, "pre_ref_path_files*_method_GET_1700011800", "2"},
		{"override", &rlsv3.RateLimitRequest{Domain: "ref",
			Descriptors: []*rlcommon.RateLimitDescriptor{overridden(desc("path", "files/c", "method", "GET"))}},
			"pre_ref_path_files/c_method_GET_1700006400", "1"},
		{"several descriptors, hits_addend", &rlsv3.RateLimitRequest{Domain: "ref", HitsAddend: 2,
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "bob"), desc("slide", "x")}}, "pre_ref_user_bob_1700010000", "2"},
	} {
		resp, err := s.ShouldRateLimit(context.Background(), tc.req)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v, %v", tc.name, resp, err)
		}
		if got, err := m.Get(tc.key); err != nil || got != tc.value {
			t.Fatalf("%s: key %s holds %q (%v), want %q; keys %q", tc.name, tc.key, got, err, tc.value, m.Keys())
		}
	}
	want := []string{
		"pre_ref_path_files*_method_GET_1700011800", "pre_ref_path_files/c_method_GET_1700006400",
		"pre_ref_user_alice_1700010000", "pre_ref_user_bob_1700010000", "pre_rl:{ref|slide=x}:counter:60",
	}
	if got := m.Keys(); !slices.Equal(got, want) {
		t.Fatalf("keys %q, want %q", got, want)
	}

	// The admin API addresses the current window's key.
	a := NewAdmin(s, directAdmin{l})
	entries := []*adminv1.Entry{{Key: "user", Value: "bob"}}
	insp, err := a.Inspect(context.Background(), &adminv1.InspectRequest{Domain: "ref", Entries: entries})
	if err != nil || insp.Key != "pre_ref_user_bob_1700010000" || insp.Used != 2 || insp.Algorithm != "reference_fixed_window" ||
		insp.ResetAfter.AsDuration() != 30*time.Minute-5*time.Second {
		t.Fatalf("Inspect: %v, %v", insp, err)
	}
	if _, err := a.Reset(context.Background(), &adminv1.ResetRequest{Domain: "ref", Entries: entries}); err != nil {
		t.Fatal(err)
	}
	// The count is 0 (the reference's replicas read it so too), its life a
	// millisecond longer: a charge before the Reset names the key's life by
	// its expiry, and gives back nothing of a later life.
	if got, err := m.Get("pre_ref_user_bob_1700010000"); err != nil || got != "0" {
		t.Fatalf("after Reset the key holds %q (%v), want 0", got, err)
	}
	insp, err = a.Inspect(context.Background(), &adminv1.InspectRequest{Domain: "ref", Entries: entries})
	if err != nil || insp.Used != 0 {
		t.Fatalf("Inspect after Reset: %v, %v", insp, err)
	}
}

// overridden gives d a limit override of 10 a day.
func overridden(d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_DAY}
	return d
}
