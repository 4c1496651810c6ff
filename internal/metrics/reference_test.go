package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestStatLabels(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want [3]string
	}{
		{"rl.remote_address", [3]string{"rl", "remote_address", ""}},
		{"rl.masked_remote_address_0.0.0.0/0.header_x", [3]string{"rl", "masked_remote_address_0_0_0_0/0", "header_x"}},
		{"rl.a.b.c.d", [3]string{"rl", "a", "b"}},
		{"api.path_/v1/*", [3]string{"api", "path_/v1/*"}},
		{"d.k_a:b|c", [3]string{"d", "k_a_b_c"}},
		{"d.host_example.com", [3]string{"d", "host_example", "com"}}, // dots outside IPv4 addresses split, as in the reference
	} {
		if got := statLabels(sanitizeStatName(tc.key)); got != tc.want {
			t.Errorf("statLabels(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestHits checks the counts of envoyproxy/ratelimit's base_limiter.go:
// hits, not requests, split between near and over by where the counter
// stood. Limit 10, near ratio 0.8: near from 8.
func TestHits(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		cost, before                  uint64
		admitted, shadow              bool
		total, within, near, over, sh float64
	}{
		{"well within", 1, 2, true, false, 1, 1, 0, 0, 0},
		{"crossing into near", 3, 6, true, false, 3, 3, 1, 0, 0},
		{"all near", 2, 8, true, false, 2, 2, 2, 0, 0},
		{"to the limit", 2, 8, true, false, 2, 2, 2, 0, 0},
		{"over from inside", 4, 8, false, false, 4, 0, 2, 2, 0},
		{"over from below near", 6, 5, false, false, 6, 0, 2, 1, 0},
		{"over already", 3, 10, false, false, 3, 0, 0, 3, 0},
		{"shadow over", 3, 10, false, true, 3, 0, 0, 3, 3},
		{"shadow crossing", 4, 8, false, true, 4, 0, 2, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(prometheus.NewRegistry())
			s := m.Descriptor("d.k", "d.k")
			s.Hits(tc.cost, 10, tc.before, tc.admitted, tc.shadow, 0.8)
			for _, c := range []struct {
				vec  *prometheus.CounterVec
				want float64
			}{
				{m.ref.totalHits, tc.total}, {m.ref.withinLimit, tc.within}, {m.ref.nearLimit, tc.near},
				{m.ref.overLimit, tc.over}, {m.ref.shadowMode, tc.sh},
			} {
				if got := testutil.ToFloat64(c.vec.WithLabelValues("d", "k", "")); got != c.want {
					t.Errorf("%s: %v, want %v", describe(c.vec), got, c.want)
				}
			}
		})
	}
}

func describe(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 1)
	c.Describe(ch)
	return (<-ch).String()
}

// TestReferenceSeriesAreBounded: past MaxReferenceSeries, keys built from
// request values fall back to their rule's key.
func TestReferenceSeriesAreBounded(t *testing.T) {
	m := New(prometheus.NewRegistry())
	for i := range MaxReferenceSeries + 50 {
		m.Descriptor(fmt.Sprintf("d.user_%d", i), "d.user").Total(1)
	}
	if n := testutil.CollectAndCount(m.ref.totalHits); n != MaxReferenceSeries+1 {
		t.Fatalf("%d series, want %d", n, MaxReferenceSeries+1)
	}
	if got := testutil.ToFloat64(m.ref.totalHits.WithLabelValues("d", "user", "")); got != 50 {
		t.Fatalf("fallback series counted %v, want 50", got)
	}
	if got := testutil.ToFloat64(m.ref.capped); got != 50 {
		t.Fatalf("ratelimit_metric_series_capped_total %v, want the 50 descriptors past the bound", got)
	}
}

// TestReferenceNamesExposed: the names Envoy Gateway's dashboard and docs
// query are exposed, with their labels.
func TestReferenceNamesExposed(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Descriptor("rl.remote_address", "rl.remote_address").Hits(1, 5, 0, true, false, 0.8)
	m.InvalidRequest("empty_domain")
	m.StoreCall(0, "timeout")
	m.ConfigLoaded(1, "h", "", "")
	m.ConfigReload("failure")
	m.GlobalShadowMode()
	m.ref.totalRequests.WithLabelValues("ShouldRateLimit").Inc()
	m.ref.responseTime.WithLabelValues("ShouldRateLimit").Observe(0.001)
	want := `
# HELP ratelimit_service_config_load_error envoyproxy/ratelimit's config_load_error: reloads refused.
# TYPE ratelimit_service_config_load_error counter
ratelimit_service_config_load_error 1
# HELP ratelimit_service_config_load_success envoyproxy/ratelimit's config_load_success: ` +
		`configs put in force, the first and every reload that changed it.
# TYPE ratelimit_service_config_load_success counter
ratelimit_service_config_load_success 1
# HELP ratelimit_service_global_shadow_mode envoyproxy/ratelimit's global_shadow_mode: requests over a limit answered OK because of --shadow-mode.
# TYPE ratelimit_service_global_shadow_mode counter
ratelimit_service_global_shadow_mode 1
# HELP ratelimit_service_rate_limit_total_hits envoyproxy/ratelimit's total_hits: hits (request costs) on a limit, ` +
		`by domain and the first two levels of the rule's key.
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{domain="rl",key1="remote_address",key2=""} 1
# HELP ratelimit_service_should_rate_limit_error envoyproxy/ratelimit's should_rate_limit errors: ` +
		`err_type redis_error (a failed store call) or service_error (a refused request, an overload).
# TYPE ratelimit_service_should_rate_limit_error counter
ratelimit_service_should_rate_limit_error{err_type="redis_error"} 1
ratelimit_service_should_rate_limit_error{err_type="service_error"} 1
# HELP ratelimit_service_total_requests envoyproxy/ratelimit's total_requests: gRPC calls, by method.
# TYPE ratelimit_service_total_requests counter
ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 1
`
	names := []string{"ratelimit_service_config_load_error", "ratelimit_service_config_load_success",
		"ratelimit_service_global_shadow_mode", "ratelimit_service_rate_limit_total_hits",
		"ratelimit_service_should_rate_limit_error", "ratelimit_service_total_requests"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "ratelimit_service_response_time_seconds"); err != nil || n != 1 {
		t.Fatalf("response time: %d series, %v", n, err)
	}
}

// countingStats counts the statsd counters made, by name.
type countingStats struct{ names map[string]int }

func (c *countingStats) Counter(name string) StatCounter { c.names[name]++; return nopStat{} }
func (c *countingStats) Timer(string) StatTimer          { return nopStat{} }

type nopStat struct{}

func (nopStat) Add(uint64)       {}
func (nopStat) AddValue(float64) {}

// TestDomainNotFoundIsBounded: unknown domains, which clients name, get
// statsd counters up to MaxReferenceSeries, and no more.
func TestDomainNotFoundIsBounded(t *testing.T) {
	stats := &countingStats{names: map[string]int{}}
	m := NewWithStats(prometheus.NewRegistry(), stats)
	for i := range MaxReferenceSeries + 50 {
		m.DomainNotFound(fmt.Sprintf("d%d", i), 1)
	}
	m.DomainNotFound("d0", 1)
	n := 0
	for name := range stats.names {
		if strings.HasSuffix(name, ".domain_not_found") {
			n++
		}
	}
	if n != MaxReferenceSeries || stats.names["ratelimit.service.rate_limit.d0.domain_not_found"] != 1 {
		t.Fatalf("%d domain_not_found counters (d0 made %d times), want %d", n, stats.names["ratelimit.service.rate_limit.d0.domain_not_found"],
			MaxReferenceSeries)
	}
}
