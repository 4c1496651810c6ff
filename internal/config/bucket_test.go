package config

import (
	"slices"
	"testing"
)

const bucketYAML = `
domain: b
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 600}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 60}
        descriptors:
          - key: path
            value: /api/*
            rate_limit: {unit: minute, requests_per_unit: 6}
      - key: user
        value: root
        descriptors:
          - key: action
            value: delete
            rate_limit: {unit: minute, requests_per_unit: 1}
  - key: host
    value: "*.example.com"
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: a
    value: x
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    value: y
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: z
    value: v
    descriptors:
      - key: n
        rate_limit: {unit: second, requests_per_unit: 1}
        descriptors:
          - key: m
            rate_limit: {unit: second, requests_per_unit: 1}
      - key: m
        rate_limit: {unit: second, requests_per_unit: 1}
        descriptors:
          - key: n
            rate_limit: {unit: second, requests_per_unit: 1}
`

func TestBucketEntries(t *testing.T) {
	c, err := Parse("b.yaml", []byte(bucketYAML), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		domain string
		bucket map[string]string
		want   []BucketEntry // nil: ok is false
		rule   string        // the rule Match gives, "" for nil
	}{
		{
			"nested keys in any order", "b", map[string]string{"path": "/api/v1", "user": "bob", "tenant": "acme"},
			[]BucketEntry{{"tenant", "acme"}, {"user", "bob"}, {"path", "/api/v1"}}, "b: tenant=acme / user / path=/api/*",
		},
		{"one key", "b", map[string]string{"tenant": "acme"}, []BucketEntry{{"tenant", "acme"}}, "b: tenant=acme"},
		{"key-only node", "b", map[string]string{"user": "alice", "tenant": "acme"},
			[]BucketEntry{{"tenant", "acme"}, {"user", "alice"}}, "b: tenant=acme / user"},
		{"wildcard node", "b", map[string]string{"host": "api.example.com"}, []BucketEntry{{"host", "api.example.com"}}, "b: host=*.example.com"},
		{"exact beats key-only, and a node without a limit is no rule", "b", map[string]string{"user": "root", "tenant": "acme"},
			[]BucketEntry{{"tenant", "acme"}, {"user", "root"}}, ""},
		{"three levels through exact values", "b", map[string]string{"action": "delete", "user": "root", "tenant": "acme"},
			[]BucketEntry{{"tenant", "acme"}, {"user", "root"}, {"action", "delete"}}, "b: tenant=acme / user=root / action=delete"},
		{"two keys named at a level: the byte-order first that finds a node", "b", map[string]string{"a": "x", "c": "q"},
			[]BucketEntry{{"a", "x"}, {"c", "q"}}, "b: a=x / c"},
		{"the byte-order first finds no node: the next one is placed", "b", map[string]string{"a": "z", "b": "y"},
			[]BucketEntry{{"b", "y"}, {"a", "z"}}, "b: b=y / a"},
		{"the keys left stay in byte order after one is placed", "b", map[string]string{"n": "1", "m": "2", "z": "v"},
			[]BucketEntry{{"z", "v"}, {"m", "2"}, {"n", "1"}}, "b: z=v / m / n"},
		{"no backtracking: the first placed decides the branch", "b", map[string]string{"a": "x", "b": "y"}, nil, ""},
		{"a key the config never names", "b", map[string]string{"tenant": "acme", "nope": "x"}, nil, ""},
		{"a value that finds no node", "b", map[string]string{"tenant": "other"}, nil, ""},
		{"a nested value that finds no node", "b", map[string]string{"tenant": "acme", "user": "root", "action": "read"}, nil, ""},
		{"more keys than the branch is deep", "b", map[string]string{"host": "api.example.com", "tenant": "acme"}, nil, ""},
		{"unknown domain", "other", map[string]string{"tenant": "acme"}, nil, ""},
		{"empty bucket", "b", map[string]string{}, nil, ""},
		{"nil bucket", "b", nil, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for range 10 { // Go's map order changes between walks
				got, ok := BucketEntries(c, tt.domain, tt.bucket)
				if ok != (tt.want != nil) || !slices.Equal(got, tt.want) {
					t.Fatalf("BucketEntries(%q, %v) = %v, %v, want %v", tt.domain, tt.bucket, got, ok, tt.want)
				}
			}
			if tt.want == nil {
				return
			}
			kv := make([]string, 0, 2*len(tt.want))
			for _, e := range tt.want {
				kv = append(kv, e.Key, e.Value)
			}
			got, _ := BucketEntries(c, tt.domain, tt.bucket)
			rule, descriptorRule := Match(c, tt.domain, got), Match(c, tt.domain, entries(kv...))
			if rule != descriptorRule {
				t.Fatalf("Match of the bucket's entries = %v, of the descriptor = %v", rule, descriptorRule)
			}
			if s := ruleString(rule); s != tt.rule {
				t.Fatalf("rule %q, want %q", s, tt.rule)
			}
		})
	}
}

func ruleString(r *Rule) string {
	if r == nil {
		return ""
	}
	return r.String()
}

// TestBucketEntriesAllocatesOnlyTheResult: the returned slice is the walk's
// only allocation, whether it places every key or not.
func TestBucketEntriesAllocatesOnlyTheResult(t *testing.T) {
	c, err := Parse("b.yaml", []byte(bucketYAML), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, bucket := range []map[string]string{
		{"path": "/api/v1", "user": "bob", "tenant": "acme"},
		{"tenant": "acme", "user": "root", "action": "read"},
	} {
		if allocs := testing.AllocsPerRun(100, func() { BucketEntries(c, "b", bucket) }); allocs != 1 {
			t.Errorf("BucketEntries(%v) allocates %v times per run, want 1", bucket, allocs)
		}
	}
	unknown := map[string]string{"a": "x"}
	if allocs := testing.AllocsPerRun(100, func() { BucketEntries(c, "other", unknown) }); allocs != 0 {
		t.Errorf("BucketEntries of an unknown domain allocates %v times per run, want 0", allocs)
	}
}
