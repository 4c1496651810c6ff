package service

import (
	"context"
	"io"
	"maps"
	"net/http/httptest"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/metrics"
)

const statKeyConfig = `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /foo
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: /files/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: detailed
    detailed_metric: true
    descriptors:
      - key: leaf
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: client_id
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: docs
    value: /docs/*
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: shared
    value: /s/*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
`

// TestStatKey: the names envoyproxy/ratelimit's config_impl.go GetLimit
// gives, with detailed_metric and value_to_metric.
func TestStatKey(t *testing.T) {
	cfg, err := config.Parse("k.yaml", []byte(statKeyConfig), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries       []string
		key, fallback string
	}{
		{[]string{"remote_address", "10.0.0.1"}, "d.remote_address", "d.remote_address"},
		{[]string{"path", "/foo"}, "d.path_/foo", "d.path_/foo"},
		{[]string{"source_cluster", "proxy", "destination_cluster", "mock"}, "d.source_cluster_proxy.destination_cluster", ""},
		{[]string{"files", "/files/a"}, "d.files_/files/*", ""},
		{[]string{"detailed", "x", "leaf", "y"}, "d.detailed_x.leaf_y", "d.detailed.leaf"},
		{[]string{"detailed", "x", "leaf", ""}, "d.detailed_x.leaf_", "d.detailed.leaf"},
		{[]string{"client_id", "alice"}, "d.client_id_alice", "d.client_id"},
		{[]string{"docs", "/docs/a.txt"}, "d.docs_/docs/a.txt", "d.docs_/docs/*"},
		{[]string{"shared", "/s/1"}, "d.shared_/s/*", "d.shared_/s/*"},
		{[]string{"tenant", "acme", "user", "bob"}, "d.tenant_acme.user", "d.tenant.user"},
	} {
		d := desc(tc.entries...)
		rule := config.Match(cfg, "d", d.Entries)
		if rule == nil {
			t.Fatalf("%v: no rule", tc.entries)
		}
		key, fallback := statKey("d", rule, d.Entries)
		if tc.fallback == "" {
			tc.fallback = tc.key
		}
		if key != tc.key || fallback != tc.fallback {
			t.Errorf("%v: %q, %q; want %q, %q", tc.entries, key, fallback, tc.key, tc.fallback)
		}
	}
	key, _ := statKey("d", nil, []*rlcommon.RateLimitDescriptor_Entry{{Key: "a", Value: "1"}, {Key: "b", Value: "2"}})
	if key != "d.a.b" {
		t.Errorf("override without a rule: %q, want the keys alone", key)
	}
}

// TestReferenceMetricsCountDecisions: a rule of 2 per minute, asked three
// times: 3 hits, 2 within, 1 near (past floor(0.8*2) = 1), 1 over.
func TestReferenceMetricsCountDecisions(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _ := newTestService(t, &Options{Metrics: metrics.New(reg)})
	for range 3 {
		ask(t, s, desc("tenant", "a"))
	}
	want := `
# HELP ratelimit_service_rate_limit_total_hits envoyproxy/ratelimit's total_hits: hits (request costs) on a limit, ` +
		`by domain and the first two levels of the rule's key.
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{domain="svc",key1="tenant",key2=""} 3
# HELP ratelimit_service_rate_limit_within_limit envoyproxy/ratelimit's within_limit: hits admitted.
# TYPE ratelimit_service_rate_limit_within_limit counter
ratelimit_service_rate_limit_within_limit{domain="svc",key1="tenant",key2=""} 2
# HELP ratelimit_service_rate_limit_near_limit envoyproxy/ratelimit's near_limit: hits past --near-limit-ratio of the limit and within it.
# TYPE ratelimit_service_rate_limit_near_limit counter
ratelimit_service_rate_limit_near_limit{domain="svc",key1="tenant",key2=""} 1
# HELP ratelimit_service_rate_limit_over_limit envoyproxy/ratelimit's over_limit: hits past the limit (shadow-mode rules included).
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit{domain="svc",key1="tenant",key2=""} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_service_rate_limit_total_hits",
		"ratelimit_service_rate_limit_within_limit", "ratelimit_service_rate_limit_near_limit",
		"ratelimit_service_rate_limit_over_limit"); err != nil {
		t.Fatal(err)
	}
}

// TestConfigText: /rlconfig on the debug port, as the reference prints it.
func TestConfigText(t *testing.T) {
	s, _ := newTestService(t, nil)
	rec := httptest.NewRecorder()
	s.ConfigTextHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
	body, _ := io.ReadAll(rec.Body)
	want := `svc.tenant: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false
svc.vip: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false
svc.path_/files/*: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false
svc.path_/docs/*: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false
svc.report: unit=SECOND requests_per_unit=4, shadow_mode: false, quota_mode: false
`
	if string(body) != want {
		t.Fatalf("got\n%s\nwant\n%s", body, want)
	}
}

// TestReferenceMetricsHostileValues: a rule whose metric name takes the
// request's value (value_to_metric, detailed_metric) is answered whatever
// the value's bytes or length, and its series name stays bounded.
func TestReferenceMetricsHostileValues(t *testing.T) {
	cfg, err := config.Parse("d.yaml", []byte(statKeyConfig), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := New(cfg, admitAll{}, &Options{Metrics: metrics.New(reg)})
	long := strings.Repeat("v", 64<<10)
	for _, value := range []string{"\xff\xfe not UTF-8", long} {
		for _, key := range []string{"client_id", "detailed"} {
			d := desc(key, value)
			if key == "detailed" {
				d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "leaf", Value: value})
			}
			resp := askRequest(t, s, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
			if resp.Statuses[0].CurrentLimit == nil {
				t.Fatalf("%s=%.20q: no limit applied: %v", key, value, resp)
			}
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if len(l.GetValue()) > 256 {
					t.Errorf("%s{%s=...} is %d bytes long: a client's value sets the series' size", f.GetName(), l.GetName(), len(l.GetValue()))
				}
			}
		}
	}
}

// namedStats records the statsd counters' sums, by name.
type namedStats map[string]uint64

type namedCounter struct {
	stats namedStats
	name  string
}

func (c namedCounter) Add(n uint64) { c.stats[c.name] += n }

func (s namedStats) Counter(name string) metrics.StatCounter { return namedCounter{s, name} }
func (s namedStats) Timer(string) metrics.StatTimer          { return nil }

// TestDomainNotFound: a request to a domain the config does not have
// counts its descriptors in the reference's domain_not_found, the domain
// bounded as a request value is.
func TestDomainNotFound(t *testing.T) {
	stats := namedStats{}
	s, _ := newTestService(t, &Options{Metrics: metrics.NewWithStats(prometheus.NewRegistry(), stats)})
	long := strings.Repeat("d", 64<<10)
	for _, domain := range []string{"nope", long, "svc"} {
		askRequest(t, s, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{
			desc("tenant", "a"), desc("vip", "b")}})
	}
	const prefix, suffix = "ratelimit.service.rate_limit.", ".domain_not_found"
	want := namedStats{prefix + "nope" + suffix: 2, prefix + metricValue(long) + suffix: 2}
	got := namedStats{}
	for name, n := range stats {
		if strings.HasSuffix(name, suffix) {
			got[name] = n
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("domain_not_found: %v, want %v", got, want)
	}
}

// TestDomainNotFoundWithoutStats: without statsd, a request to an unknown
// domain makes no name of it: a long domain costs what a short one does.
func TestDomainNotFoundWithoutStats(t *testing.T) {
	s, _ := newTestService(t, &Options{Metrics: metrics.New(prometheus.NewRegistry())})
	allocs := func(domain string) float64 {
		req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}}
		return testing.AllocsPerRun(100, func() {
			if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		})
	}
	if short, long := allocs("nope"), allocs(strings.Repeat("d", 64<<10)); long != short {
		t.Fatalf("a long unknown domain: %v allocations a request, a short one %v", long, short)
	}
}
