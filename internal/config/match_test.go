package config

import (
	"fmt"
	"sync"
	"testing"
)

// entry is like Envoy's *RateLimitDescriptor_Entry.
type entry struct{ key, value string }

func (e *entry) GetKey() string   { return e.key }
func (e *entry) GetValue() string { return e.value }
func (e *entry) String() string   { return fmt.Sprintf("%q=%q", e.key, e.value) }

func entries(kv ...string) []*entry {
	es := make([]*entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &entry{kv[i], kv[i+1]})
	}
	return es
}

const matchYAML = `
domain: m
descriptors:
  - key: path
    value: /api/v1/users
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}

  - key: file
    value: "*.tar.*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: file
    value: "*.tar.gz"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: file
    value: "a*b*c"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: file
    value: "ab*ba"
    rate_limit: {unit: second, requests_per_unit: 1}

  - key: host
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}

  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: user
        value: root
        descriptors:
          - key: action
            value: delete
            rate_limit: {unit: second, requests_per_unit: 1}

  - key: leaf

  - key: odd
    value: "nul\0 tab\t é ✓"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: odd
    value: "pre*"
    rate_limit: {unit: second, requests_per_unit: 1}
`

func TestMatch(t *testing.T) {
	c, err := Parse("m.yaml", []byte(matchYAML), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		domain  string
		entries []*entry
		want    string // the rule's String(), "" for nil
	}{
		{"exact beats wildcard", "m", entries("path", "/api/v1/users"), "m: path=/api/v1/users"},
		{"wildcard beats key-only", "m", entries("path", "/api/v2/users"), "m: path=/api/*"},
		{"wildcard matches an empty run", "m", entries("path", "/api/"), "m: path=/api/*"},
		{"key-only", "m", entries("path", "/health"), "m: path"},
		{"key-only takes the empty value", "m", entries("path", ""), "m: path"},
		{"first wildcard in file order", "m", entries("file", "x.tar.gz"), "m: file=*.tar.*"},
		{"several stars", "m", entries("file", "a-b-c"), "m: file=a*b*c"},
		{"several stars all empty", "m", entries("file", "abc"), "m: file=a*b*c"},
		{"star in the middle needs its part", "m", entries("file", "ac"), ""},
		{"prefix and suffix do not overlap", "m", entries("file", "aba"), ""},
		{"prefix and suffix", "m", entries("file", "abba"), "m: file=ab*ba"},
		{"no match and no key-only", "m", entries("file", "x.zip"), ""},
		{"lone star matches anything", "m", entries("host", "example.com"), "m: host=*"},
		{"lone star matches empty", "m", entries("host", ""), "m: host=*"},
		{"unknown key", "m", entries("nope", "x"), ""},
		{"node with limit and children", "m", entries("tenant", "acme"), "m: tenant=acme"},
		{"nested key-only", "m", entries("tenant", "acme", "user", "bob"), "m: tenant=acme / user"},
		{"nested exact without limit", "m", entries("tenant", "acme", "user", "root"), ""},
		{"three levels", "m", entries("tenant", "acme", "user", "root", "action", "delete"), "m: tenant=acme / user=root / action=delete"},
		{"nested miss", "m", entries("tenant", "acme", "user", "root", "action", "read"), ""},
		{"more entries than depth", "m", entries("tenant", "acme", "user", "bob", "action", "delete"), ""},
		{"deeper than the tree", "m", entries("path", "/health", "user", "bob"), ""},
		{"sibling missing", "m", entries("tenant", "other", "user", "bob"), ""},
		{"node without limit or children", "m", entries("leaf", "x"), ""},
		{"no entries", "m", entries(), ""},
		{"unknown domain", "other", entries("path", "/health"), ""},
		{"odd bytes exact", "m", entries("odd", "nul\x00 tab\t é ✓"), "m: odd=nul\x00 tab\t é ✓"},
		{"invalid UTF-8 in a wildcard", "m", entries("odd", "pre\xff\xfe"), "m: odd=pre*"},
		{"invalid UTF-8 key", "m", entries("odd\xff", "pre"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if r := Match(c, tt.domain, tt.entries); r != nil {
				got = r.String()
			}
			if got != tt.want {
				t.Errorf("Match(%q, %v) = %q, want %q", tt.domain, tt.entries, got, tt.want)
			}
		})
	}
}

// TestMatchConcurrent gives the race detector concurrent readers.
func TestMatchConcurrent(t *testing.T) {
	c, err := Parse("m.yaml", []byte(matchYAML), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	es := entries("tenant", "acme", "user", "bob")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if Match(c, "m", es) == nil {
					t.Error("no match")
				}
			}
		})
	}
	wg.Wait()
}

// benchCases walk the exact, wildcard, key-only and nested paths.
var benchCases = [][]*entry{
	entries("path", "/api/v1/users"),
	entries("path", "/api/v2/orders"),
	entries("path", "/health"),
	entries("file", "a-b-c"),
	entries("tenant", "acme", "user", "root", "action", "delete"),
	entries("unknown", "x"),
}

func TestMatchDoesNotAllocate(t *testing.T) {
	c, err := Parse("m.yaml", []byte(matchYAML), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		for _, es := range benchCases {
			Match(c, "m", es)
		}
		Match(c, "other", benchCases[0])
	})
	if allocs != 0 {
		t.Errorf("Match allocates %v times per run, want 0", allocs)
	}
}

func BenchmarkMatch(b *testing.B) {
	c, err := Parse("m.yaml", []byte(matchYAML), Defaults{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		Match(c, "m", benchCases[i%len(benchCases)])
	}
}
