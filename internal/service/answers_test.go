package service

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// answersConfig has the reference's quota example (service_1, service_2)
// and its way to block (requests_per_unit: 0).
const answersConfig = `
domain: svc
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 2}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: per_tenant}]}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}, common: {a: 1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}, common: {b: 2}}
  - key: blocked
    rate_limit: {name: banned, unit: minute, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`

func newAnswersService(t *testing.T, opts *Options) (*Service, *miniredis.Miniredis, *config.Config) {
	t.Helper()
	return miniService(t, "answers.yaml", answersConfig, opts)
}

// miniService serves the config yaml (named file) with opts, on a limiter
// without a deny cache over a miniredis whose clock is frozen.
func miniService(t *testing.T, file, yaml string, opts *Options) (*Service, *miniredis.Miniredis, *config.Config) {
	t.Helper()
	cfg, err := config.Parse(file, []byte(yaml), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	m.SetTime(time.Unix(1_700_006_400, 0))
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	return New(cfg, decision.Direct(l), opts), m, cfg
}

func askRequest(t *testing.T, s *Service, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func headerValue(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

func withOverride(d *rlcommon.RateLimitDescriptor, n uint32) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_MINUTE}
	return d
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// answerCodes returns the overall code, then each status's.
func answerCodes(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	c := []rlsv3.RateLimitResponse_Code{resp.OverallCode}
	for _, st := range resp.Statuses {
		c = append(c, st.Code)
	}
	return c
}

func equalCodes(a, b []rlsv3.RateLimitResponse_Code) bool { return slices.Equal(a, b) }

// TestOverrideIsALimitOfItsOwn: as the reference, a descriptor's limit
// override answers without the matched rule's name, and neither replaces
// nor is replaced.
func TestOverrideIsALimitOfItsOwn(t *testing.T) {
	s, _, _ := newAnswersService(t, nil)
	resp := ask(t, s, withOverride(desc("tenant", "t1"), 5))
	if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.Name != "" || cl.RequestsPerUnit != 5 {
		t.Fatalf("override: current_limit %v, want 5 a minute without the rule's name", cl)
	}
	// The vip rule replaces per_tenant, but an override on vip replaces
	// nothing: the tenant rule applies, with its name.
	resp = ask(t, s, desc("tenant", "t2"), withOverride(desc("vip", "v"), 50))
	if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.Name != "per_tenant" {
		t.Fatalf("tenant beside an overridden vip: current_limit %v, want per_tenant", cl)
	}
	// An override on the tenant rule has no name, so vip cannot replace it.
	resp = ask(t, s, withOverride(desc("tenant", "t3"), 5), desc("vip", "v"))
	if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.RequestsPerUnit != 5 {
		t.Fatalf("overridden tenant beside vip: current_limit %v, want the override, not replaced", cl)
	}
	// Without overrides, vip replaces per_tenant.
	resp = ask(t, s, desc("tenant", "t4"), desc("vip", "v"))
	if resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("tenant beside vip: %v, want replaced", resp.Statuses[0])
	}
}

func TestOverLimitReportsNoneRemaining(t *testing.T) {
	s, _, _ := newAnswersService(t, nil)
	req := &rlsv3.RateLimitRequest{Domain: "svc", HitsAddend: 3, Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "u")}}
	if st := askRequest(t, s, req).Statuses[0]; st.Code != ok || st.LimitRemaining != 2 {
		t.Fatalf("first 3 of 5: %v", st)
	}
	// 2 are left, but 3 do not fit: the status says 0, as the reference.
	if st := askRequest(t, s, req).Statuses[0]; st.Code != over || st.LimitRemaining != 0 {
		t.Fatalf("next 3 of 5: %v, want OVER_LIMIT with 0 remaining", st)
	}
}

// TestHeadersComeFromTheDenyingDescriptor: on a denied request the headers
// describe the last descriptor that denied it (the reference's rule), even
// when an earlier one has as little left; header names are configurable.
func TestHeadersComeFromTheDenyingDescriptor(t *testing.T) {
	s, _, _ := newAnswersService(t, &Options{RateLimitHeaders: true, LimitHeader: "X-Limit", RemainingHeader: "X-Remaining", ResetHeader: "X-Reset"})
	// user alone, cost 5: 0 of 5 left.
	req := &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "u")}}
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(5)
	resp := askRequest(t, s, req)
	if resp.OverallCode != ok || headerValue(resp, "X-Limit") != "5" || headerValue(resp, "X-Remaining") != "0" || headerValue(resp, "X-Reset") == "" {
		t.Fatalf("admitted: %v", resp)
	}
	// user (0 left: denied) first, then another denying descriptor.
	resp = ask(t, s, desc("user", "u"), desc("tenant", "t"), desc("blocked", "b"))
	if !equalCodes(answerCodes(resp), []rlsv3.RateLimitResponse_Code{over, over, ok, over}) {
		t.Fatalf("codes %v", answerCodes(resp))
	}
	if got := headerValue(resp, "X-Limit"); got != "0" {
		t.Errorf("X-Limit %q, want 0 from the blocked rule, the last that denied", got)
	}
	if got := headerValue(resp, DefaultLimitHeader); got != "" {
		t.Errorf("default header name used: %q", got)
	}
	// Without the flag, no such header.
	plain, _, _ := newAnswersService(t, nil)
	if resp := ask(t, plain, desc("blocked", "b")); len(resp.ResponseHeadersToAdd) != 1 || resp.ResponseHeadersToAdd[0].Key != "retry-after" {
		t.Errorf("headers without --ratelimit-headers: %v", resp.ResponseHeadersToAdd)
	}
}

// TestQuotaMode follows the reference's quota.sh: service_1 admits 1 a
// minute, service_2 2; a request is denied once both are over.
func TestQuotaMode(t *testing.T) {
	s, _, _ := newAnswersService(t, &Options{RateLimitHeaders: true})
	for i, want := range [][]rlsv3.RateLimitResponse_Code{
		{ok, ok, ok},
		{ok, over, ok}, // service_1 is over, service_2 still has quota
		{over, over, over},
	} {
		resp := ask(t, s, desc("service", "service_1"), desc("service", "service_2"))
		if got := answerCodes(resp); !equalCodes(got, want) {
			t.Fatalf("request %d: codes %v, want %v", i+1, got, want)
		}
		for j, st := range resp.Statuses {
			if st.Code == over && st.LimitRemaining != 0 {
				t.Errorf("request %d, status %d: OVER_LIMIT with %d remaining", i+1, j, st.LimitRemaining)
			}
		}
		denied := resp.OverallCode == over
		if got := headerValue(resp, "retry-after"); denied != (got != "") {
			t.Errorf("request %d: retry-after %q", i+1, got)
		}
		if denied && headerValue(resp, DefaultRemainingHeader) != "0" {
			t.Errorf("request %d: %s %q on a denial", i+1, DefaultRemainingHeader, headerValue(resp, DefaultRemainingHeader))
		}
	}
	// An ordinary descriptor over its limit denies whatever the quotas say,
	// and the request charges nothing, as one whose quotas are all over
	// (TestQuotaDenialChargesNothing).
	s2, m, _ := newAnswersService(t, nil)
	resp := ask(t, s2, desc("blocked", "b"), desc("service", "service_1"))
	if got := answerCodes(resp); !equalCodes(got, []rlsv3.RateLimitResponse_Code{over, over, ok}) {
		t.Fatalf("blocked beside a quota: codes %v", got)
	}
	if keys := m.Keys(); len(keys) != 0 {
		t.Fatalf("a denied request charged: %q", keys)
	}
}

// TestQuotaDenialChargesNothing: when every quota descriptor of a request
// is over, the request is OVER_LIMIT and, as any denied request, charges
// none of its ordinary descriptors; when one quota fits, it charges them.
func TestQuotaDenialChargesNothing(t *testing.T) {
	s, _, _ := newAnswersService(t, nil)
	ask(t, s, desc("service", "service_1")) // service_1's 1 a minute is spent
	resp := ask(t, s, desc("user", "u"), desc("service", "service_1"))
	if resp.OverallCode != over {
		t.Fatalf("every quota over: %v, want OVER_LIMIT", resp.OverallCode)
	}
	// user has 5 a minute: a request charging 1 shows 4 remaining, unless
	// the denied request above was charged.
	if got := ask(t, s, desc("user", "u")).Statuses[0].LimitRemaining; got != 4 {
		t.Fatalf("user after a denied request and one admitted: %d remaining, want 4", got)
	}
	resp = ask(t, s, desc("user", "u"), desc("service", "service_1"), desc("service", "service_2"))
	if got := answerCodes(resp); !equalCodes(got, []rlsv3.RateLimitResponse_Code{ok, ok, over, ok}) {
		t.Fatalf("one quota of two over: codes %v", got)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 3 {
		t.Fatalf("user beside a quota that fits: %d remaining, want 3 (charged)", got)
	}
}

// TestQuotaDescriptorOverChargesNone: a quota descriptor answered
// OVER_LIMIT charges none of its limits, as every denial: api's per-second
// limit is over, its per-minute one would fit and stays as it was. The
// request passes when another quota descriptor fits (charging it and the
// ordinary ones), and is denied, charging nothing, when none does.
func TestQuotaDescriptorOverChargesNone(t *testing.T) {
	const yaml = `domain: svc
descriptors:
  - key: api
    quota_mode: true
    rate_limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: minute, requests_per_unit: 5}
  - key: backup
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`
	for _, tt := range []struct {
		name       string
		backupFull bool                           // backup's one a minute spent beforehand
		want       []rlsv3.RateLimitResponse_Code // overall, api, backup, user
		left       [3]uint32                      // then api's per-minute remaining, backup's, user's
	}{
		{"another quota fits", false, []rlsv3.RateLimitResponse_Code{ok, over, ok, ok}, [3]uint32{2, 0, 9}},
		{"every quota over", true, []rlsv3.RateLimitResponse_Code{over, over, over, ok}, [3]uint32{2, 0, 10}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, m, _ := miniService(t, "q.yaml", yaml, nil)
			// api's per-second limit spent: 3 of its per-minute 5 too.
			askRequest(t, s, &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: []*rlcommon.RateLimitDescriptor{desc("api", "a")}, HitsAddend: 3})
			if tt.backupFull {
				ask(t, s, desc("backup", "b"))
			}
			resp := ask(t, s, desc("api", "a"), desc("backup", "b"), desc("user", "u"))
			if got := answerCodes(resp); !equalCodes(got, tt.want) {
				t.Fatalf("codes %v, want %v", got, tt.want)
			}
			// Two seconds on, api's per-second window is empty again, and a
			// check shows its per-minute remaining, the least of the two.
			m.SetTime(time.Unix(1_700_006_402, 0))
			for i, key := range []string{"api", "backup", "user"} {
				check := desc(key, key[:1])
				check.HitsAddend = wrapperspb.UInt64(0)
				if got := ask(t, s, check).Statuses[0].LimitRemaining; got != tt.left[i] {
					t.Errorf("%s: %d remaining, want %d", key, got, tt.left[i])
				}
			}
		})
	}
}

// TestShadowQuotaKeepsTheRequestCharged: a quota descriptor in shadow mode
// always passes, so the other quotas cannot deny the request, and its
// ordinary descriptors are charged even when they are all over.
func TestShadowQuotaKeepsTheRequestCharged(t *testing.T) {
	cfg, err := config.Parse("q.yaml", []byte(`domain: svc
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: watched
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	s := New(cfg, decision.Direct(l), nil)
	resp := ask(t, s, desc("user", "u"), desc("quota", "q"), desc("watched", "w"))
	if got := answerCodes(resp); !equalCodes(got, []rlsv3.RateLimitResponse_Code{ok, ok, over, ok}) {
		t.Fatalf("codes %v, want the request OK, its quota over", got)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 4 {
		t.Fatalf("user: %d remaining, want 4 (charged)", got)
	}
	resp = ask(t, s, desc("user", "u"), desc("quota", "q"))
	if got := answerCodes(resp); !equalCodes(got, []rlsv3.RateLimitResponse_Code{over, ok, over}) {
		t.Fatalf("without the shadow quota: codes %v, want OVER_LIMIT", got)
	}
	if got := ask(t, s, desc("user", "u")).Statuses[0].LimitRemaining; got != 3 {
		t.Fatalf("user: %d remaining, want 3 (the denied request charged nothing)", got)
	}
}

// TestGlobalQuotaMode: with Options.QuotaMode every descriptor is a quota
// descriptor, one without a limit too (it always passes).
func TestGlobalQuotaMode(t *testing.T) {
	s, _, _ := newAnswersService(t, &Options{QuotaMode: true})
	if got := answerCodes(ask(t, s, desc("blocked", "b"), desc("user", "u"))); !equalCodes(got, []rlsv3.RateLimitResponse_Code{ok, over, ok}) {
		t.Errorf("blocked beside user: codes %v", got)
	}
	if got := answerCodes(ask(t, s, desc("blocked", "b"), desc("nothing", "matches"))); !equalCodes(got, []rlsv3.RateLimitResponse_Code{ok, over, ok}) {
		t.Errorf("blocked beside an unmatched descriptor: codes %v", got)
	}
	if got := answerCodes(ask(t, s, desc("blocked", "b"))); !equalCodes(got, []rlsv3.RateLimitResponse_Code{over, over}) {
		t.Errorf("blocked alone: codes %v", got)
	}
}

// TestReplacesLeavesUnlimited: as the reference, which sets unlimited limits
// aside before replaces apply, an unlimited limit named in another's
// replaces still answers unlimited, and under the global quota mode is no
// quota descriptor: the only quota descriptor is over, so is the request.
func TestReplacesLeavesUnlimited(t *testing.T) {
	cfg, err := config.Parse("r.yaml", []byte(`domain: svc
descriptors:
  - key: free
    rate_limit: {name: open, unlimited: true}
  - key: capped
    rate_limit: {unit: minute, requests_per_unit: 0, replaces: [{name: open}]}
`), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	for _, quotaMode := range []bool{false, true} {
		s := New(cfg, decision.Direct(l), &Options{QuotaMode: quotaMode})
		resp := ask(t, s, desc("free", "x"), desc("capped", "y"))
		if got := answerCodes(resp); !equalCodes(got, []rlsv3.RateLimitResponse_Code{over, ok, over}) {
			t.Errorf("quota mode %v: codes %v, want [OVER_LIMIT OK OVER_LIMIT]", quotaMode, got)
		}
		if got := resp.Statuses[0].LimitRemaining; got != math.MaxUint32 {
			t.Errorf("quota mode %v: the unlimited descriptor has %d remaining, want %d", quotaMode, got, uint32(math.MaxUint32))
		}
	}
}

// TestZeroLimitDeniesWithoutTheStore: requests_per_unit 0 denies every
// request, a check of cost 0 too, without a store call.
func TestZeroLimitDeniesWithoutTheStore(t *testing.T) {
	s, m, _ := newAnswersService(t, nil)
	check := desc("blocked", "b")
	check.HitsAddend = wrapperspb.UInt64(0)
	before := m.CommandCount()
	for _, d := range []*rlcommon.RateLimitDescriptor{desc("blocked", "b"), check} {
		resp := ask(t, s, d)
		st := resp.Statuses[0]
		if resp.OverallCode != over || st.Code != over || st.LimitRemaining != 0 ||
			st.CurrentLimit.GetName() != "banned" || st.CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("%v: %v", d, resp)
		}
		if got := headerValue(resp, "retry-after"); got != "60" {
			t.Errorf("retry-after %q, want the window, 60", got)
		}
	}
	if n := m.CommandCount() - before; n != 0 {
		t.Fatalf("%d store commands for a zero limit", n)
	}
}

// TestDynamicMetadata checks the answer's dynamic_metadata field by field,
// as the reference builds it.
func TestDynamicMetadata(t *testing.T) {
	s, _, cfg := newAnswersService(t, &Options{ResponseDynamicMetadata: true})
	ov := withOverride(desc("tenant", "t"), 7)
	ov.HitsAddend = wrapperspb.UInt64(1)
	req := &rlsv3.RateLimitRequest{Domain: "svc", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{
		desc("service", "service_1"), desc("service", "service_2"), ov,
	}}
	wantJSON := func(metadata string) *structpb.Struct {
		t.Helper()
		js := `{"domain": "svc", "hitsAddend": 1, "descriptors": [
			{"entries": ["service=service_1"]},
			{"entries": ["service=service_2"]},
			{"entries": ["tenant=t"], "limit": ` + protojsonString(t, ov.Limit.String()) + `, "hitsAddend": 1}]` + metadata + `}`
		var want structpb.Struct
		if err := protojson.Unmarshal([]byte(js), &want); err != nil {
			t.Fatal(err)
		}
		return &want
	}
	// Both quotas admit: their metadata merge, nested mappings too; the
	// first to set a field keeps it.
	got := askRequest(t, s, req).DynamicMetadata
	if want := wantJSON(`, "metadata": {"service_with_quota": {"name": "service_1"}, "common": {"a": 1, "b": 2}}`); !proto.Equal(got, want) {
		t.Fatalf("dynamic_metadata\n%v\nwant\n%v", got, want)
	}
	// service_1 is over: only service_2's metadata.
	got = askRequest(t, s, req).DynamicMetadata
	if want := wantJSON(`, "metadata": {"service_with_quota": {"name": "service_2"}, "common": {"b": 2}}`); !proto.Equal(got, want) {
		t.Fatalf("dynamic_metadata\n%v\nwant\n%v", got, want)
	}
	// Merging never touched the config's own metadata.
	for _, r := range cfg.Rules() {
		if r.Path() == "service=service_1" {
			if c := r.Metadata.Fields["common"].GetStructValue(); len(c.Fields) != 1 {
				t.Fatalf("rule metadata changed: %v", r.Metadata)
			}
		}
	}
	// Off by default.
	plain, _, _ := newAnswersService(t, nil)
	if md := askRequest(t, plain, req).DynamicMetadata; md != nil {
		t.Fatalf("dynamic_metadata without the option: %v", md)
	}
}

// protojsonString quotes s as a JSON string.
func protojsonString(t *testing.T, s string) string {
	t.Helper()
	b, err := protojson.Marshal(structpb.NewStringValue(s))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDynamicMetadataOfAnyBytes: values that are not UTF-8 still make an
// answer that encodes.
func TestDynamicMetadataOfAnyBytes(t *testing.T) {
	s, _, _ := newAnswersService(t, &Options{ResponseDynamicMetadata: true})
	resp := ask(t, s, desc("user", "\xff\xfe"), desc("\xc3", "x"))
	if _, err := proto.Marshal(resp); err != nil {
		t.Fatalf("answer does not encode: %v", err)
	}
	entries := resp.DynamicMetadata.Fields["descriptors"].GetListValue().Values[0].GetStructValue().Fields["entries"].GetListValue().Values
	if got := entries[0].GetStringValue(); got != "user=\uFFFD" {
		t.Errorf("entry %q", got)
	}
}
