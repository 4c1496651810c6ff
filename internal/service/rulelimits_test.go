package service

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// ruleLimitSeries lists the ratelimit_rule_limit series as
// "domain rule algorithm window_seconds = value", sorted.
func ruleLimitSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if f.GetName() != "ratelimit_rule_limit" {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, fmt.Sprintf("%s %s %s %s = %v", labels["domain"], labels["rule"], labels["algorithm"],
				labels["window_seconds"], m.GetGauge().GetValue()))
		}
	}
	slices.Sort(out)
	return out
}

// TestRuleLimitGauge: every limit of the config in force is a gauge,
// named as decisions name their rule; a reload replaces them.
func TestRuleLimitGauge(t *testing.T) {
	parse := func(yaml string) *config.Config {
		cfg, err := config.Parse("test.yaml", []byte(yaml), config.Defaults{})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	first := parse(`
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: sliding_window_log}
      - {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 600}
  - key: open
    rate_limit: {unlimited: true}
`)
	reg := prometheus.NewRegistry()
	svc := New(first, nil, &Options{Metrics: metrics.New(reg)})
	want := []string{
		"api per_tenant sliding_window_counter 60 = 600",
		"api user [0] sliding_window_log 1 = 10",
		"api user [1] fixed_window 3600 = 1000",
	}
	if got := ruleLimitSeries(t, reg); !slices.Equal(got, want) {
		t.Errorf("at start:\n got %q\nwant %q", got, want)
	}
	svc.Reload(parse(`
domain: api
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 300}
`))
	want = []string{"api per_tenant sliding_window_counter 60 = 300"}
	if got := ruleLimitSeries(t, reg); !slices.Equal(got, want) {
		t.Errorf("after a reload:\n got %q\nwant %q", got, want)
	}
}
