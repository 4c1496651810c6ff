package config

import (
	"strings"
	"testing"
	"time"
)

// TestLeases: leases and lease_ttl are read on a log rule, lease_ttl by
// default the window (0), and refused where they cannot hold.
func TestLeases(t *testing.T) {
	parse := func(rl string) (*Rule, error) {
		doc := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, " + rl + "}\n"
		cfg, err := Parse("inline.yaml", []byte(doc), Defaults{})
		if err != nil {
			return nil, err
		}
		return cfg.Rules()[0], nil
	}
	r, err := parse("algorithm: sliding_window_log, leases: true, lease_ttl: 30s")
	if err != nil || !r.Leases || r.LeaseTTL != 30*time.Second {
		t.Fatalf("leases with lease_ttl 30s: %+v, %v", r, err)
	}
	if r, err = parse("algorithm: sliding_window_log, leases: true"); err != nil || !r.Leases || r.LeaseTTL != 0 {
		t.Fatalf("leases without lease_ttl: %+v, %v", r, err)
	}
	if r, err = parse("algorithm: sliding_window_log, leases: false"); err != nil || r.Leases {
		t.Fatalf("leases: false: %+v, %v", r, err)
	}
	for rl, want := range map[string]string{
		"algorithm: gcra, leases: true":                                    "leases apply only to algorithm sliding_window_log",
		"algorithm: sliding_window_log, lease_ttl: 30s":                    "lease_ttl applies only to a rule with leases: true",
		"algorithm: sliding_window_log, leases: true, lease_ttl: soon":     `lease_ttl "soon"`,
		"algorithm: sliding_window_log, leases: true, lease_ttl: 0s":       `lease_ttl "0s"`,
		"algorithm: sliding_window_log, leases: true, lease_ttl: 1000000h": `lease_ttl "1000000h"`,
		"algorithm: sliding_window_log, leases: true, lease_ttl: 2m":       "lease_ttl 2m0s is longer than the rule's window 1m0s",
		"algorithm: sliding_window_log, leases: true, record_costs: never": "record_costs does not apply to a rule with leases",
	} {
		if _, err := parse(rl); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", rl, err, want)
		}
	}
	const unlimited = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, leases: true}\n"
	if _, err := Parse("inline.yaml", []byte(unlimited), Defaults{}); err == nil || !strings.Contains(err.Error(), "should not specify rate limit leases when unlimited") {
		t.Errorf("leases on an unlimited rule: %v", err)
	}
	const several = "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n" +
		"      - {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log, leases: true}\n" +
		"      - {unit: hour, requests_per_unit: 50}\n"
	if _, err := Parse("inline.yaml", []byte(several), Defaults{}); err == nil || !strings.Contains(err.Error(), "several limits cannot have one with leases") {
		t.Errorf("leases among several limits: %v", err)
	}
}
