package config_test

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/pkg/config"
)

func TestLoadDirectory(t *testing.T) {
	cfg, err := config.Load("testdata/dir", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		domain  string
		entries []config.Entry
		source  string // "" when no rule applies
		limits  []config.Limit
		shadow  bool
	}{
		{"ai", []config.Entry{{"user", "u1"}}, "testdata/dir/budgets.yaml:5", []config.Limit{
			{Requests: 10, Window: time.Second, Algorithm: "sliding_window_counter"},
			{Requests: 1000, Window: 24 * time.Hour, Algorithm: "sliding_window_counter"},
		}, false},
		{"ai", []config.Entry{{"team", "t"}}, "testdata/dir/budgets.yaml:9", []config.Limit{
			{Requests: 100000, Window: time.Hour, Algorithm: "sliding_window_counter"},
			{Requests: 2000, Window: time.Hour, Algorithm: "sliding_window_log"},
		}, false},
		{"api", []config.Entry{{"path", "/health"}}, "testdata/dir/api.yml:3", nil, false},
		{"api", []config.Entry{{"path", "/v1"}}, "testdata/dir/api.yml:6", []config.Limit{
			{Requests: 5, Window: time.Second, Algorithm: "sliding_window_counter"},
		}, true},
		{"api", []config.Entry{{"user", "u1"}}, "", nil, false},
		{"nope", []config.Entry{{"path", "/v1"}}, "", nil, false},
	} {
		rule, ok := cfg.Match(tc.domain, tc.entries...)
		if ok != (tc.source != "") {
			t.Errorf("%s %v: matched %v, want %v", tc.domain, tc.entries, ok, tc.source != "")
			continue
		}
		if !ok {
			continue
		}
		if rule.Source() != tc.source || rule.Domain() != tc.domain || rule.Shadow() != tc.shadow ||
			!reflect.DeepEqual(rule.Limits(), tc.limits) {
			t.Errorf("%s %v: rule %s at %s shadow %v limits %v; want %s shadow %v limits %v",
				tc.domain, tc.entries, rule, rule.Source(), rule.Shadow(), rule.Limits(), tc.source, tc.shadow, tc.limits)
		}
	}
	if n := len(cfg.Rules()); n != 7 {
		t.Errorf("%d rules, want 7 (5 in budgets.yaml, 2 in api.yml; README is not read)", n)
	}
}

func TestOptions(t *testing.T) {
	const yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	for _, tc := range []struct {
		name    string
		opts    *config.Options
		algo    string
		wantErr string
	}{
		{"nil", nil, "sliding_window_counter", ""},
		{"default algorithm", &config.Options{DefaultAlgorithm: "gcra"}, "gcra", ""},
		{"unknown algorithm", &config.Options{DefaultAlgorithm: "leaky"}, "", `"leaky"`},
	} {
		cfg, err := config.Parse("d.yaml", []byte(yaml), tc.opts)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want one naming %s", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rule, _ := cfg.Match("d", config.Entry{Key: "k", Value: "v"})
		if got := rule.Limits()[0].Algorithm; got != tc.algo {
			t.Errorf("%s: algorithm %s, want %s", tc.name, got, tc.algo)
		}
	}
}

// A domain in two files is an error unless MergeDomains.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	write(t, dir+"/a.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	write(t, dir+"/b.yaml", "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	if _, err := config.Load(dir, nil); err == nil {
		t.Error("a domain in two files: want an error")
	}
	cfg, err := config.Load(dir, &config.Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Rules()) != 2 {
		t.Errorf("merged: %d rules, want 2", len(cfg.Rules()))
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A fixed window of months follows the calendar, and says which; a sliding
// month is 30 days long.
func TestCalendarLimits(t *testing.T) {
	const yaml = `domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: month, requests_per_unit: 3, algorithm: fixed_window, time_zone: Europe/Berlin}
      - {unit: month, requests_per_unit: 5}
`
	cfg, err := config.Parse("calendar.yaml", []byte(yaml), nil)
	if err != nil {
		t.Fatal(err)
	}
	rule, ok := cfg.Match("d", config.Entry{Key: "k", Value: "v"})
	if !ok {
		t.Fatal("no rule")
	}
	month := 30 * 24 * time.Hour
	want := []config.Limit{
		{Requests: 3, Window: month, Calendar: "1mo@Europe/Berlin", Algorithm: "fixed_window"},
		{Requests: 5, Window: month, Algorithm: "sliding_window_counter"},
	}
	if got := rule.Limits(); !reflect.DeepEqual(got, want) {
		t.Errorf("limits %+v, want %+v", got, want)
	}
}
