package config

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLoadEnvoyGateway loads every config Envoy Gateway's translator renders
// in its tests, and checks what a few of them say.
func TestLoadEnvoyGateway(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "envoygateway", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 25 {
		t.Fatalf("%d files in testdata/envoygateway, want the 25 copied", len(files))
	}
	loaded := map[string]*Config{}
	documents := 0
	for _, f := range files {
		c, err := Load(f, Defaults{})
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if w := c.Warnings(); len(w) > 0 {
			t.Errorf("%s: warnings %q", f, w)
		}
		loaded[filepath.Base(f)] = c
		documents += len(c.domains)
	}
	if documents != 32 {
		t.Errorf("%d domains loaded, want 32 (one per document)", documents)
	}
	if t.Failed() {
		return
	}

	for _, tt := range []struct {
		file, domain string
		entries      []*entry
		want         string // summary of the rule matched, "" for none
	}{
		// A distinct match is a key-only node: one counter per value.
		{"distinct-match.yaml", "first-listener", entries("first-route", "first-route", "rule-0-match-0", "u1"),
			"first-listener: first-route=first-route / rule-0-match-0 | 5/SECOND*1 sliding_window_counter defer @distinct-match.yaml:8"},
		{"distinct-match.yaml", "first-listener", entries("first-route", "first-route"), ""},
		{"month-year-rule.yaml", "first-listener", entries("first-route", "first-route", "rule-0-match-0", "rule-0-match-0"),
			"first-listener: first-route=first-route / rule-0-match-0=rule-0-match-0 | 5/MONTH*1 sliding_window_counter defer @month-year-rule.yaml:8"},
		{"month-year-rule.yaml", "first-listener", entries("second-route", "second-route", "rule-0-match-0", "rule-0-match-0"),
			"first-listener: second-route=second-route / rule-0-match-0=rule-0-match-0 | 1/YEAR*1 sliding_window_counter defer @month-year-rule.yaml:31"},
		{"multiple-domains.yaml", "test-namespace/test-policy-1",
			entries("test-namespace/test-policy-1/rule/0", "test-namespace/test-policy-1/rule/0", "rule-0-match-0", "rule-0-match-0"),
			"test-namespace/test-policy-1: test-namespace/test-policy-1/rule/0=test-namespace/test-policy-1/rule/0 / " +
				"rule-0-match-0=rule-0-match-0 | 5/SECOND*1 sliding_window_counter defer @multiple-domains.yaml:35"},
		{"multiple-domains.yaml", "first-listener", entries("second-route", "second-route", "rule-0-match-0", "rule-0-match-0"),
			"first-listener: second-route=second-route / rule-0-match-0=rule-0-match-0 | 5/SECOND*1 sliding_window_counter defer @multiple-domains.yaml:8"},
		{"global-shadow-mode.yaml", "first-listener",
			entries("first-route", "first-route", "rule-0-match-0", "rule-0-match-0", "rule-0-match-1", "rule-0-match-1",
				"rule-0-match-2", "rule-0-match-2", "masked_remote_address", "0.0.0.0/0"),
			"first-listener: first-route=first-route / rule-0-match-0=rule-0-match-0 / rule-0-match-1=rule-0-match-1 / " +
				"rule-0-match-2=rule-0-match-2 / masked_remote_address=0.0.0.0/0 | 5/SECOND*1 sliding_window_counter defer shadow @global-shadow-mode.yaml:20"},
		{"multiple-rules.yaml", "first-listener", entries("first-route", "first-route", "rule-1-match-0", "rule-1-match-0"),
			"first-listener: first-route=first-route / rule-1-match-0=rule-1-match-0 | " +
				"4294967295/SECOND*1 sliding_window_counter defer @multiple-rules.yaml:22"},
	} {
		r := Match(loaded[tt.file], tt.domain, tt.entries)
		var got string
		if r != nil {
			got = summary(r)
		}
		if got != tt.want {
			t.Errorf("%s: Match(%s, %v):\n  %s\nwant\n  %s", tt.file, tt.domain, tt.entries, got, tt.want)
		}
	}
	// Every rule Envoy Gateway renders names no rule and replaces none; all
	// are plain limits.
	for f, c := range loaded {
		for _, r := range c.Rules() {
			if r.Unlimited || r.QuotaMode || r.Metadata != nil || r.Name != "" || len(r.Replaces) > 0 || r.RequestsPerUnit == 0 {
				t.Errorf("%s: unexpected rule %s", f, summary(r))
			}
		}
	}
}

// TestLoadReference loads the reference's example configs.
func TestLoadReference(t *testing.T) {
	dir := filepath.Join("testdata", "reference")
	c, err := Load(dir, Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Warnings(); len(w) > 0 {
		t.Errorf("warnings %q", w)
	}
	want := []string{
		"mongo_cps: database=users | 500/SECOND*1 sliding_window_counter defer @config.yaml:4",
		"mongo_cps: database=default | 500/SECOND*1 sliding_window_counter defer @config.yaml:10",
		"rl: category=account | 4/MINUTE*1 sliding_window_counter defer replaces=[bkthomps fake_name] @example.yaml:4",
		"rl: source_cluster=proxy / destination_cluster=bkthomps | 2/MINUTE*1 sliding_window_counter defer replaces=[bkthomps] @example.yaml:15",
		"rl: source_cluster=proxy / destination_cluster=mock | 1/MINUTE*1 sliding_window_counter defer @example.yaml:22",
		"rl: source_cluster=proxy / destination_cluster=override | 2/MINUTE*1 sliding_window_counter defer replaces=[banned_limit] @example.yaml:27",
		"rl: source_cluster=proxy / destination_cluster=fake | 2/MINUTE*1 sliding_window_counter defer name=fake_name @example.yaml:34",
		"rl: foo | 2/MINUTE*1 sliding_window_counter defer @example.yaml:40",
		"rl: foo / bar | 3/MINUTE*1 sliding_window_counter defer @example.yaml:45",
		"rl: foo / bar=bkthomps | 1/MINUTE*1 sliding_window_counter defer name=bkthomps @example.yaml:49",
		"rl: foo / bar=banned | 0/MINUTE*1 sliding_window_counter defer name=banned_limit @example.yaml:55",
		"rl: foo / baz | 1/SECOND*1 sliding_window_counter defer @example.yaml:61",
		"rl: foo / baz=not-so-shady | 3/MINUTE*1 sliding_window_counter defer @example.yaml:65",
		"rl: foo / baz=shady | 3/MINUTE*1 sliding_window_counter defer shadow @example.yaml:70",
		"rl: foo / bay | unlimited sliding_window_counter defer @example.yaml:76",
		"rl: unspec | 2/MINUTE*1 sliding_window_counter defer detailed_metric @example.yaml:79",
		"rl: qux | unlimited sliding_window_counter defer @example.yaml:84",
		`rl: service=service_1 | 1/MINUTE*1 sliding_window_counter defer quota metadata={"service_with_quota":{"name":"service_1"}} @example.yaml:87`,
		`rl: service=service_2 | 2/MINUTE*1 sliding_window_counter defer quota metadata={"service_with_quota":{"name":"service_2"}} @example.yaml:96`,
	}
	if got := summaries(c.Rules()); !slices.Equal(got, want) {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMergeDomains(t *testing.T) {
	dir := filepath.Join("testdata", "merge")
	if _, err := Load(dir, Defaults{}); err == nil || !strings.Contains(err.Error(), `domain "shared" already defined in testdata/merge/a.yaml:1`) {
		t.Errorf("without MergeDomains: error %v", err)
	}
	c, err := Load(dir, Defaults{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	wantRules := []string{
		"shared: tenant | 10/MINUTE*1 sliding_window_counter defer @a.yaml:3",
		"shared: user | 2/SECOND*1 sliding_window_counter defer name=per_user @b.yaml:3",
		"shared: tenant=big | 100/MINUTE*1 sliding_window_counter defer replaces=[per_user] @b.yaml:5",
	}
	if got := summaries(c.Rules()); !slices.Equal(got, wantRules) {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantRules, "\n"))
	}
	// The merged tree answers for both files: the exact value of b.yaml
	// wins over the key-only node of a.yaml.
	for _, tt := range []struct {
		entries []*entry
		want    string
	}{
		{entries("tenant", "small"), "shared: tenant"},
		{entries("tenant", "big"), "shared: tenant=big"},
		{entries("user", "u1"), "shared: user"},
	} {
		if r := Match(c, "shared", tt.entries); r == nil || r.String() != tt.want {
			t.Errorf("Match(%v) = %v, want %s", tt.entries, r, tt.want)
		}
	}
	// The replaces name is found across files: no warning.
	if w := c.Warnings(); len(w) > 0 {
		t.Errorf("warnings %q", w)
	}
	if got := c.Files(); !slices.Equal(got, []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")}) {
		t.Errorf("Files() = %q", got)
	}

	// A top-level descriptor defined in two merged files is a duplicate,
	// as in the reference.
	dup := filepath.Join("testdata", "mergedup")
	wantErr := want(t, filepath.Join(dup, "b.yaml"))
	if _, err := Load(dup, Defaults{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), wantErr) {
		t.Errorf("error = %v, want it to contain %q", err, wantErr)
	}
}

func TestWarnings(t *testing.T) {
	c, err := Parse("w.yaml", []byte(`domain: d
descriptors:
  - key: a
    rate_limit:
      name: per_a
      unit: second
      requests_per_unit: 1
      replaces: [{name: per_b}, {name: per_c}]
  - key: b
    rate_limit: {name: per_b, unit: second, requests_per_unit: 1}
  - key: c
    metadata: {x: 1}
    descriptors:
      - key: d
        rate_limit: {unit: second, requests_per_unit: 1}
`), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`w.yaml:12: metadata on a descriptor without rate_limit has no effect`,
		`w.yaml:8: replaces "per_c", but no rule of domain "d" has that name`,
	}
	if got := c.Warnings(); !slices.Equal(got, want) {
		t.Errorf("Warnings() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMetadata(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       string // JSON of the Struct, keys sorted; "" for nil
	}{
		{"absent", ``, ``},
		{"null", `metadata: null`, ``},
		{"empty", `metadata: {}`, ``},
		{"nested", "metadata:\n      svc: {name: s1, tags: [a, b]}", `{"svc":{"name":"s1","tags":["a","b"]}}`},
		// As the reference reads YAML (yaml.v2): numbers, booleans, null;
		// every other scalar is its text, a timestamp and a quoted number too.
		{"scalars", `metadata: {i: 7, h: 0x10, f: 1.5, b: true, n: ~, t: 2001-12-14, q: "7", s: word}`,
			`{"b":true,"f":1.5,"h":16,"i":7,"n":null,"q":"7","s":"word","t":"2001-12-14"}`},
		// yaml.v2 resolves YAML 1.1's words, plain only, as booleans.
		{"yaml 1.1 booleans", `metadata: {t: [y, Y, yes, Yes, YES, on, On, ON, True, TRUE], f: [n, N, no, No, NO, off, Off, OFF, False, FALSE]}`,
			`{"f":[false,false,false,false,false,false,false,false,false,false],"t":[true,true,true,true,true,true,true,true,true,true]}`},
		{"yaml 1.1 booleans nested", "metadata:\n      m: {a: yes, b: [off]}", `{"m":{"a":true,"b":[false]}}`},
		{"not yaml 1.1 booleans", `metadata: {sq: 'yes', dq: "off", tag: !!str on, mixed: yEs, other: oN, word: yess}`,
			`{"dq":"off","mixed":"yEs","other":"oN","sq":"yes","tag":"on","word":"yess"}`},
		{"block scalar", "metadata:\n      l: |-\n        yes", `{"l":"yes"}`},
		{"non-string keys", `metadata: {1: one, true: x, on: yes}`, `{"1":"one","on":true,"true":"x"}`},
		{"alias", "metadata:\n      a: &x {k: v}\n      b: *x", `{"a":{"k":"v"},"b":{"k":"v"}}`},
		{"merge", "metadata:\n      base: &b {k: base, only: base}\n      m: {k: own, <<: *b}",
			`{"base":{"k":"base","only":"base"},"m":{"k":"own","only":"base"}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
			if tt.yaml != "" {
				doc += "    " + tt.yaml + "\n"
			}
			c, err := Parse("m.yaml", []byte(doc), Defaults{})
			if err != nil {
				t.Fatal(err)
			}
			md := c.Rules()[0].Metadata
			var got string
			if md != nil {
				js, err := json.Marshal(md.AsMap())
				if err != nil {
					t.Fatal(err)
				}
				got = string(js)
			}
			if got != tt.want {
				t.Errorf("metadata = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestMetadataAliasBomb: aliases that name each other many times over are
// refused, not expanded.
func TestMetadataAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata:\n")
	b.WriteString("      a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 8; i++ {
		b.WriteString("      a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	_, err := Parse("bomb.yaml", []byte(b.String()), Defaults{})
	if err == nil || !strings.Contains(err.Error(), "metadata expands to more than 10000 values") {
		t.Errorf("error = %v", err)
	}
}
