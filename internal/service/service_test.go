package service

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

const testConfig = `
domain: svc
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 2}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: per_tenant}]}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: path
    value: /docs/*
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: report
    rate_limit: {name: reports, unit: second, unit_multiplier: 30, requests_per_unit: 4}
`

// newTestService serves testConfig from a miniredis with a frozen clock.
func newTestService(t *testing.T, opts *Options) (*Service, *miniredis.Miniredis) {
	t.Helper()
	return serveRules(t, testConfig, opts)
}

// serveRules serves rules (a config file's YAML) from a miniredis whose
// clock is frozen at the start of a minute.
func serveRules(t *testing.T, rules string, opts *Options) (*Service, *miniredis.Miniredis) {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(rules), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	m.SetTime(time.Unix(1_700_006_400, 0)) // a multiple of 60
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	return New(cfg, decision.Direct(l), opts), m
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t *testing.T, s *Service, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestReplacedRuleDoesNotApply(t *testing.T) {
	s, _ := newTestService(t, nil)
	for i := 0; i < 5; i++ {
		resp := ask(t, s, desc("tenant", "t1"), desc("vip", "t1"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("hit %d: %v, want per_tenant replaced by the vip rule", i, resp)
		}
	}
	// Alone, the tenant rule applies.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := ask(t, s, desc("tenant", "t1")).OverallCode; got != want {
			t.Fatalf("tenant alone, hit %d: %v, want %v", i, got, want)
		}
	}
}

func TestShareThresholdSharesOneCounter(t *testing.T) {
	s, m := newTestService(t, nil)
	for i, path := range []string{"/files/a", "/files/b", "/files/c"} {
		if resp := ask(t, s, desc("path", path)); resp.Statuses[0].LimitRemaining != uint32(2-i) {
			t.Fatalf("%s: %v", path, resp.Statuses[0])
		}
	}
	if got := ask(t, s, desc("path", "/files/d")).OverallCode; got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fourth shared path: %v", got)
	}
	// Without share_threshold each value counts on its own.
	for _, path := range []string{"/docs/a", "/docs/b", "/docs/c", "/docs/d"} {
		if resp := ask(t, s, desc("path", path)); resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("%s: %v", path, resp.Statuses[0])
		}
	}
	if !m.Exists("rl:{svc|path=*/files/%2A}:fixed:60") {
		t.Fatalf("shared key missing; keys: %q", m.Keys())
	}
}

func TestCurrentLimitAndHeaders(t *testing.T) {
	s, _ := newTestService(t, &Options{RateLimitHeaders: true})
	resp := ask(t, s, desc("report", "r"), desc("tenant", "x"))
	want := &rlsv3.RateLimitResponse_RateLimit{Name: "reports", RequestsPerUnit: 4, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
	got := resp.Statuses[0].CurrentLimit
	if got.Name != want.Name || got.RequestsPerUnit != want.RequestsPerUnit || got.Unit != want.Unit || got.UnitMultiplier.GetValue() != 30 {
		t.Fatalf("current_limit %v, want reports 4 per 30 s", got)
	}
	// The tenant descriptor has the least remaining (1 of 2). Its sliding
	// counter is whole again only when this window's hit stops weighing as
	// "previous", at the end of the next window: 120 s from a window start.
	headers := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	wantHeaders := map[string]string{
		"RateLimit-Limit":     "2",
		"RateLimit-Remaining": "1",
		"RateLimit-Reset":     "120",
	}
	for k, v := range wantHeaders {
		if headers[k] != v {
			t.Errorf("%s: %q, want %q", k, headers[k], v)
		}
	}
	if _, found := headers["retry-after"]; found {
		t.Error("retry-after on an OK answer")
	}
}

func TestOverrideUnitMustBeKnown(t *testing.T) {
	s, _ := newTestService(t, nil)
	d := desc("tenant", "o")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("override without unit: %v, want InvalidArgument", err)
	}
	d.Limit.Unit = typev3.RateLimitUnit_SECOND
	if resp := ask(t, s, d); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("override: %v", resp)
	}
}

func TestSetConfigSwapsAtomically(t *testing.T) {
	s, _ := newTestService(t, nil)
	next, err := config.Parse("next.yaml",
		[]byte("domain: svc\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Reload(next) {
		t.Fatal("Reload of a different config reported no change")
	}
	if got := ask(t, s, desc("tenant", "n")).Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 7 {
		t.Fatalf("limit %d after SetConfig, want 7", got)
	}
}

func TestOverrideWindowBounds(t *testing.T) {
	s, _ := newTestService(t, nil)
	cases := []struct {
		unit       typev3.RateLimitUnit
		multiplier uint32
		ok         bool
	}{
		{typev3.RateLimitUnit_YEAR, 100, true},
		{typev3.RateLimitUnit_YEAR, 101, false},
		{typev3.RateLimitUnit_YEAR, 293, false}, // overflows a time.Duration if multiplied first
		{typev3.RateLimitUnit_YEAR, 585, false}, // wraps around to about 21 days
		{typev3.RateLimitUnit_SECOND, 0, false},
	}
	for _, tc := range cases {
		d := desc("tenant", "w")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: tc.unit, UnitMultiplier: wrapperspb.UInt32(tc.multiplier)}
		_, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "svc", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if ok := err == nil; ok != tc.ok || (!ok && status.Code(err) != codes.InvalidArgument) {
			t.Errorf("%v x %d: error %v, want ok=%v (else InvalidArgument)", tc.unit, tc.multiplier, err, tc.ok)
		}
	}
}

func TestSharedCounterInOneRequest(t *testing.T) {
	s, m := newTestService(t, nil)
	resp := ask(t, s, desc("path", "/files/a"), desc("path", "/files/b"), desc("path", "/files/c"), desc("path", "/files/d"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("four shared paths against 3 in one request: %v", resp)
	}
	if keys := m.Keys(); len(keys) != 0 {
		t.Fatalf("a denied request charged: %q", keys)
	}
}

// TestShadowOverItsLimitIsTheTightest: as in the reference (and Envoy's
// x-ratelimit-* headers, built from the statuses), a shadow rule over its
// limit answers OK with 0 remaining, and so the headers show it.
func TestShadowOverItsLimitIsTheTightest(t *testing.T) {
	cfg, err := config.Parse("shadow.yaml", []byte(`
domain: svc
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: real
    rate_limit: {unit: minute, requests_per_unit: 10}
`), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newTestService(t, &Options{RateLimitHeaders: true})
	s.Reload(cfg)
	var resp *rlsv3.RateLimitResponse
	for i := 0; i < 3; i++ {
		resp = ask(t, s, desc("real", "x"), desc("shadow", "x"))
	}
	if got := headerValue(resp, DefaultRemainingHeader); got != "0" || headerValue(resp, DefaultLimitHeader) != "1" {
		t.Fatalf("%s %q, want 0 from the over-limit shadow rule", DefaultRemainingHeader, got)
	}
	if st := resp.Statuses[1]; resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK ||
		st.LimitRemaining != 0 || st.CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("shadow over its limit: %v, want OK with 0 remaining", resp)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 7 {
		t.Fatalf("the enforced rule beside it: %d remaining, want 7", got)
	}
}

// TestHostileValuesAreLimited: a value of any length or bytes is limited on
// its own counter like any other, and a descriptor without entries is
// answered OK without a limit; neither fails the request or changes what
// the other descriptors get.
func TestHostileValuesAreLimited(t *testing.T) {
	s, m := newTestService(t, nil)
	for _, v := range []string{strings.Repeat("v", 100<<10), "\xff\xfe\x80", strings.Repeat("\xc3", 70)} {
		for i := 0; i < 3; i++ {
			resp := ask(t, s, desc("tenant", "plain-"+v[:1]), desc("tenant", v), &rlcommon.RateLimitDescriptor{})
			want := rlsv3.RateLimitResponse_OK
			if i == 2 { // both limits are 2 a minute
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if len(resp.Statuses) != 3 || resp.Statuses[0].Code != want || resp.Statuses[1].Code != want ||
				resp.Statuses[1].CurrentLimit == nil || resp.Statuses[2].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[2].CurrentLimit != nil {
				t.Fatalf("%d-byte value, hit %d: %v", len(v), i, resp)
			}
		}
	}
	for _, k := range m.Keys() {
		if len(k) > 128 {
			t.Fatalf("key of %d bytes: %q", len(k), k)
		}
	}
}

// TestRevertClearsTheReloadError: a bad write followed by a revert to the
// config in force leaves nothing wrong to show.
func TestRevertClearsTheReloadError(t *testing.T) {
	s, _ := newTestService(t, nil)
	s.ReloadFailed(errors.New("test.yaml:4: unknown unit"))
	same, err := config.Parse("test.yaml", []byte(testConfig), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Reload(same) {
		t.Fatal("an equal config counted as a change")
	}
	rec := httptest.NewRecorder()
	s.ConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
	if !strings.Contains(rec.Body.String(), `"last_reload_error": null`) {
		t.Fatalf("/rlconfig after the revert:\n%s", rec.Body.String())
	}
}
