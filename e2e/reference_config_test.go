package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestReferenceExampleConfig serves the reference's own example config
// (examples/ratelimit/config/example.yaml, copied unchanged) and checks its
// quota_mode, requests_per_unit: 0 and replaces answers end to end, as the
// reference's integration scripts (quota.sh, replaces.sh) expect them.
func TestReferenceExampleConfig(t *testing.T) {
	t.Parallel()
	example, err := os.ReadFile(filepath.Join("..", "internal", "config", "testdata", "reference", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := startRedis(t)
	s := startServer(t, r, string(example), "--response-dynamic-metadata")
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)

	// quota.sh: service_1 admits 1 a minute, service_2 2, both quota_mode;
	// the request is denied only once both are over. The admitted quotas'
	// metadata tells Envoy which service still has some.
	quota := request("rl", descriptor("service", "service_1"), descriptor("service", "service_2"))
	for i, want := range []struct {
		codes   []rlsv3.RateLimitResponse_Code // overall, then each status
		service string                         // metadata service_with_quota.name, "" for none
	}{
		{[]rlsv3.RateLimitResponse_Code{ok, ok, ok}, "service_1"},
		{[]rlsv3.RateLimitResponse_Code{ok, over, ok}, "service_2"},
		{[]rlsv3.RateLimitResponse_Code{over, over, over}, ""},
	} {
		resp := s.ask(t, quota)
		got := []rlsv3.RateLimitResponse_Code{resp.OverallCode}
		for _, st := range resp.Statuses {
			got = append(got, st.Code)
			if st.Code == over && st.LimitRemaining != 0 {
				t.Errorf("request %d: OVER_LIMIT status with %d remaining", i+1, st.LimitRemaining)
			}
		}
		if !slices.Equal(got, want.codes) {
			t.Fatalf("request %d: codes %v, want %v", i+1, got, want.codes)
		}
		md := resp.DynamicMetadata
		if md.GetFields()["domain"].GetStringValue() != "rl" || len(md.GetFields()["descriptors"].GetListValue().GetValues()) != 2 {
			t.Fatalf("request %d: dynamic_metadata %v", i+1, md)
		}
		name := md.GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
		if name != want.service {
			t.Errorf("request %d: metadata service_with_quota.name %q, want %q", i+1, name, want.service)
		}
	}
	if _, found := headerValue(s.ask(t, quota), "retry-after"); !found {
		t.Error("no retry-after when every quota is over")
	}

	// requests_per_unit: 0 denies every request, without touching Redis.
	banned := descriptor("foo", "x", "bar", "banned")
	for i := 0; i < 3; i++ {
		resp := s.ask(t, request("rl", banned))
		st := resp.Statuses[0]
		if resp.OverallCode != over || st.LimitRemaining != 0 || st.CurrentLimit.GetName() != "banned_limit" || st.CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("banned, request %d: %v", i+1, resp)
		}
	}
	keys, err := r.client.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, "banned") {
			t.Errorf("a zero limit wrote %s", k)
		}
	}

	// replaces.sh: destination_cluster=override replaces banned_limit, so
	// the banned descriptor does not apply beside it.
	resp := s.ask(t, request("rl", banned, descriptor("source_cluster", "proxy", "destination_cluster", "override")))
	if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 2 {
		t.Fatalf("banned beside override: %v", resp)
	}
}
