package config

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// summary describes everything Load sets on a rule, for comparisons.
func summary(r *Rule) string {
	var b strings.Builder
	b.WriteString(r.String())
	if r.Unlimited {
		b.WriteString(" | unlimited")
	} else {
		fmt.Fprintf(&b, " | %d/%s*%d", r.RequestsPerUnit, r.Unit, r.UnitMultiplier)
	}
	fmt.Fprintf(&b, " %s %s", r.Algorithm, r.FailureMode)
	if r.RecordCosts != RecordDescriptorCosts {
		fmt.Fprintf(&b, " record_costs=%s", r.RecordCosts)
	}
	last := r.Levels[len(r.Levels)-1]
	for _, f := range []struct {
		on   bool
		text string
	}{
		{r.Name != "", "name=" + r.Name},
		{len(r.Replaces) > 0, fmt.Sprint("replaces=", r.Replaces)},
		{r.ShadowMode, "shadow"},
		{r.QuotaMode, "quota"},
		{r.DetailedMetric, "detailed_metric"},
		{r.ValueToMetric, "value_to_metric"},
		{last.Wildcard, "wildcard"},
		{last.ShareThreshold, "share_threshold"},
		{r.Burst > 0, fmt.Sprint("burst=", r.Burst)},
		{r.Leases, "leases"},
		{!r.Calendar().IsZero(), "calendar=" + r.Calendar().String()},
	} {
		if f.on {
			b.WriteString(" " + f.text)
		}
	}
	if r.Metadata != nil {
		js, _ := json.Marshal(r.Metadata.AsMap()) // sorted keys, unlike protojson
		fmt.Fprintf(&b, " metadata=%s", js)
	}
	fmt.Fprintf(&b, " @%s", filepath.Base(r.Source))
	return b.String()
}

func summaries(rules []*Rule) []string {
	var s []string
	for _, r := range rules {
		s = append(s, summary(r))
	}
	return s
}

func TestLoadValid(t *testing.T) {
	for _, tt := range []struct {
		file  string
		rules []string
	}{
		{"envoy.yaml", []string{
			"envoy: remote_address | 10/SECOND*1 sliding_window_counter defer name=per_ip @envoy.yaml:5",
			"envoy: remote_address=50.0.0.5 | 1000/MINUTE*1 sliding_window_counter defer @envoy.yaml:11",
			"envoy: message_type=marketing / to_number | 5/DAY*1 sliding_window_counter defer @envoy.yaml:21",
			"envoy: message_type=marketing / to_number / from_number | 2/HOUR*1 sliding_window_counter defer @envoy.yaml:26",
			"envoy: path=/foo/* | 20/MINUTE*1 sliding_window_counter defer wildcard share_threshold @envoy.yaml:32",
			"envoy: client_id=internal | unlimited sliding_window_counter defer @envoy.yaml:39",
			"envoy: client_id | 100/HOUR*1 sliding_window_counter defer name=per_client replaces=[per_ip] shadow detailed_metric @envoy.yaml:44",
			"envoy: category | 3/WEEK*1 sliding_window_counter defer value_to_metric @envoy.yaml:54",
		}},
		{"extensions.yaml", []string{
			"api: tenant | 100/SECOND*1 sliding_window_counter defer @extensions.yaml:4",
			"api: tenant / user | 1000/MINUTE*15 sliding_window_log deny @extensions.yaml:9",
			"api: tenant / bulk | 10/DAY*1 fixed_window allow @extensions.yaml:16",
		}},
		{"budgets.yaml", []string{
			"ai: user [0] | 10/SECOND*1 sliding_window_counter defer name=burst @budgets.yaml:5",
			"ai: user [1] | 1000/DAY*1 sliding_window_counter defer name=daily @budgets.yaml:5",
			"ai: team [0] | 100000/HOUR*1 sliding_window_counter defer record_costs=always @budgets.yaml:9",
			"ai: team [1] | 2000/HOUR*1 sliding_window_log defer record_costs=never @budgets.yaml:9",
			"ai: plain | 5/MINUTE*1 sliding_window_counter defer @budgets.yaml:19",
			"ai: seats | 20/MINUTE*1 sliding_window_log defer leases @budgets.yaml:22",
			"ai: newest | 20/MINUTE*1 sliding_window_log defer @budgets.yaml:24",
		}},
		{"gcra.yaml", []string{
			"shaping: client | 10/SECOND*1 gcra defer burst=50 @gcra.yaml:4",
			"shaping: tenant | 600/MINUTE*1 gcra defer burst=600 @gcra.yaml:10",
		}},
		{"calendar.yaml", []string{
			"calendar: tenant [0] | 1000000/MONTH*1 fixed_window defer name=monthly calendar=1mo @calendar.yaml:4",
			"calendar: tenant [1] | 1000000/MONTH*1 fixed_window defer name=monthly_berlin calendar=1mo@Europe/Berlin @calendar.yaml:4",
			"calendar: tenant [2] | 3000000/MONTH*3 fixed_window defer name=quarterly calendar=3mo@America/New_York @calendar.yaml:4",
			"calendar: user [0] | 5000/WEEK*1 fixed_window defer name=weekly calendar=7d@Asia/Kolkata @calendar.yaml:9",
			"calendar: user [1] | 1000/DAY*1 fixed_window defer name=daily calendar=1d@Europe/Berlin @calendar.yaml:9",
			// UTC days are the epoch-aligned windows of old: no calendar.
			"calendar: user [2] | 1000/DAY*1 fixed_window defer name=daily_utc @calendar.yaml:9",
			"calendar: user [3] | 9000000/YEAR*1 fixed_window defer name=yearly calendar=12mo @calendar.yaml:9",
			// A sliding month is 30 days long: it has no edge to align.
			"calendar: sliding | 100/MONTH*1 sliding_window_counter defer @calendar.yaml:15",
		}},
		{"minimal.yaml", nil},
		{"documents.yaml", []string{
			"a: k | 1/SECOND*1 sliding_window_counter defer @documents.yaml:6",
			"b: k | 2/MINUTE*1 sliding_window_counter defer @documents.yaml:13",
		}},
		{"zero.yaml", []string{
			"zero: blocked | 0/SECOND*1 sliding_window_counter defer @zero.yaml:6",
			"zero: free | unlimited sliding_window_counter defer @zero.yaml:10",
			"zero: free_too | unlimited sliding_window_counter defer @zero.yaml:12",
		}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", "valid", tt.file)
			c, err := Load(path, Defaults{})
			if err != nil {
				t.Fatal(err)
			}
			if got := summaries(c.Rules()); !slices.Equal(got, tt.rules) {
				t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.rules, "\n"))
			}
			if got := c.Files(); !slices.Equal(got, []string{path}) {
				t.Errorf("Files() = %q, want [%q]", got, path)
			}
			for _, r := range c.Rules() {
				if want := path + ":"; !strings.HasPrefix(r.Source, want) {
					t.Errorf("Source = %q, want prefix %q", r.Source, want)
				}
			}
		})
	}
}

func TestLoadValidDirectory(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "valid"), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a", "ai", "api", "b", "calendar", "envoy", "minimal", "shaping", "zero"} {
		if !c.HasDomain(d) {
			t.Errorf("HasDomain(%q) = false", d)
		}
	}
	if c.HasDomain("other") {
		t.Error(`HasDomain("other") = true`)
	}
	// Ordered by domain, then as in the file.
	var got []string
	for _, r := range c.Rules() {
		got = append(got, r.String())
	}
	want := []string{
		"a: k",
		"ai: user [0]",
		"ai: user [1]",
		"ai: team [0]",
		"ai: team [1]",
		"ai: plain",
		"ai: seats",
		"ai: newest",
		"api: tenant",
		"api: tenant / user",
		"api: tenant / bulk",
		"b: k",
		"calendar: tenant [0]",
		"calendar: tenant [1]",
		"calendar: tenant [2]",
		"calendar: user [0]",
		"calendar: user [1]",
		"calendar: user [2]",
		"calendar: user [3]",
		"calendar: sliding",
		"envoy: remote_address",
		"envoy: remote_address=50.0.0.5",
		"envoy: message_type=marketing / to_number",
		"envoy: message_type=marketing / to_number / from_number",
		"envoy: path=/foo/*",
		"envoy: client_id=internal",
		"envoy: client_id",
		"envoy: category",
		"shaping: client",
		"shaping: tenant",
		"zero: blocked",
		"zero: free",
		"zero: free_too",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// want reads the "# want: " first line of a fixture.
func want(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan()
	w, ok := strings.CutPrefix(s.Text(), "# want: ")
	if !ok {
		t.Fatalf("%s: first line must be # want: <error>", path)
	}
	return w
}

func TestLoadInvalid(t *testing.T) {
	dir := filepath.Join("testdata", "invalid")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 20 {
		t.Fatalf("only %d fixtures in %s", len(entries), dir)
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			path := filepath.Join(dir, e.Name())
			want := want(t, path)
			c, err := Load(path, Defaults{})
			if err == nil {
				t.Fatalf("Load succeeded with %d rules, want error %q", len(c.Rules()), want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error:\n  %v\nwant it to contain:\n  %s", err, want)
			}
		})
	}
}

func TestLoadDuplicateDomain(t *testing.T) {
	dir := filepath.Join("testdata", "dupdomain")
	want := want(t, filepath.Join(dir, "b.yaml"))
	if _, err := Load(dir, Defaults{}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error = %v, want it to contain %q", err, want)
	}
}

func TestParse(t *testing.T) {
	c, err := Parse("inline.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	if got := summaries(c.Rules()); !slices.Equal(got, []string{"d: k | 1/SECOND*1 sliding_window_counter defer @inline.yaml:3"}) {
		t.Errorf("rules = %q", got)
	}
	if got := c.Files(); !slices.Equal(got, []string{"inline.yaml"}) {
		t.Errorf("Files() = %q", got)
	}
	_, err = Parse("bad.yaml", []byte("domain: d\nfoo: 1\n"), Defaults{})
	if err == nil || err.Error() != `bad.yaml:2: unknown field "foo" in top level` {
		t.Errorf("error = %v", err)
	}
}

// TestParseDocumentMarkers: empty documents, comment-only ones and "..."
// end markers around and between a file's documents hold no domain; a
// misspelt field in a later document is refused with its line.
func TestParseDocumentMarkers(t *testing.T) {
	const a = "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"
	const b = "domain: b\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 2}}]\n"
	for _, tt := range []struct {
		name, data string
		domains    []string
	}{
		{"leading empty documents", "---\n---\n" + a, []string{"a"}},
		{"trailing separator", a + "---\n", []string{"a"}},
		{"comment-only documents", "# c\n---\n# only a comment\n---\n" + a, []string{"a"}},
		{"two", a + "---\n" + b, []string{"a", "b"}},
		{"end marker between", a + "...\n---\n" + b, []string{"a", "b"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.yaml", []byte(tt.data), Defaults{})
			if err != nil {
				t.Fatal(err)
			}
			var domains []string
			for _, r := range c.Rules() {
				domains = append(domains, r.Domain)
			}
			if !slices.Equal(domains, tt.domains) {
				t.Errorf("domains of the rules %q, want %q", domains, tt.domains)
			}
		})
	}
	_, err := Parse("f.yaml", []byte(a+"---\ndomain: b\ndescriptor: []\n"), Defaults{})
	if err == nil || err.Error() != `f.yaml:5: unknown field "descriptor" in top level` {
		t.Errorf("misspelt field in the second document: error %v", err)
	}
}

func TestParseDocuments(t *testing.T) {
	a := Document{Name: "xds/a", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	b := Document{Name: "xds/b", Data: []byte("domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")}
	c, err := ParseDocuments([]Document{a, b}, Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a: k | 1/SECOND*1 sliding_window_counter defer @a:3", "b: k | 2/MINUTE*1 sliding_window_counter defer @b:3"} // base names
	if got := summaries(c.Rules()); !slices.Equal(got, want) {
		t.Errorf("rules = %q", got)
	}
	if got := c.Files(); !slices.Equal(got, []string{"xds/a", "xds/b"}) {
		t.Errorf("Files() = %q", got)
	}
	if same, _ := ParseDocuments([]Document{a, b}, Defaults{}); same.Hash() != c.Hash() {
		t.Error("the same documents gave another hash")
	}

	empty, err := ParseDocuments(nil, Defaults{})
	if err != nil || len(empty.Rules()) != 0 || empty.HasDomain("a") || empty.Hash() == c.Hash() {
		t.Errorf("no documents: %v, %d rules, hash %q", err, len(empty.Rules()), empty.Hash())
	}

	dup := Document{Name: "xds/c", Data: a.Data}
	_, err = ParseDocuments([]Document{a, dup}, Defaults{})
	if err == nil || !strings.Contains(err.Error(), `xds/c:1: domain "a" already defined in xds/a:1`) {
		t.Errorf("duplicate domain: error %v", err)
	}
}

func TestDefaults(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: own
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_window_log, failure_mode: allow}
  - key: free
    rate_limit: {unlimited: true}
`
	for _, tt := range []struct {
		name     string
		defaults Defaults
		want     []string // algorithm and failure mode of plain, own and free
	}{
		{"zero", Defaults{}, []string{
			"sliding_window_counter defer", "sliding_window_log allow", "sliding_window_counter defer"}},
		{"set", Defaults{Algorithm: FixedWindow, FailureMode: FailureDeny}, []string{
			"fixed_window deny", "sliding_window_log allow", "fixed_window deny"}},
		{"algorithm only", Defaults{Algorithm: SlidingWindowLog}, []string{
			"sliding_window_log defer", "sliding_window_log allow", "sliding_window_log defer"}},
		{"failure mode only", Defaults{FailureMode: FailureAllow}, []string{
			"sliding_window_counter allow", "sliding_window_log allow", "sliding_window_counter allow"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("d.yaml", []byte(yaml), tt.defaults)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range c.Rules() {
				got = append(got, fmt.Sprint(r.Algorithm, " ", r.FailureMode))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestSeveralLimits: a descriptor with rate_limits matches its first limit,
// which lists them all; a descriptor with one limit lists itself.
func TestSeveralLimits(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "valid", "budgets.yaml"), Defaults{RecordCosts: RecordAllCosts})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		key    string
		limits []string // name or unit of each limit, and its record_costs
	}{
		{"user", []string{"burst always", "daily always"}},
		{"team", []string{"HOUR always", "HOUR never"}},
		{"plain", []string{"MINUTE always"}},
	} {
		r := Match(c, "ai", entries(tt.key, "v"))
		if r == nil {
			t.Fatalf("%s: no match", tt.key)
		}
		var got []string
		for _, l := range r.Limits() {
			got = append(got, cmp.Or(l.Name, l.Unit.String())+" "+l.RecordCosts.String())
			if !slices.Equal(l.Limits(), r.Limits()) {
				t.Errorf("%s: limit %s lists other limits than the first", tt.key, l)
			}
		}
		if r != r.Limits()[0] || !slices.Equal(got, tt.limits) {
			t.Errorf("%s: limits %q (first %s), want %q", tt.key, got, r, tt.limits)
		}
	}
}

func TestCostRecording(t *testing.T) {
	for _, tt := range []struct {
		r                          CostRecording
		fromDescriptor, fromOthers bool
	}{
		{RecordDescriptorCosts, true, false},
		{RecordAllCosts, true, true},
		{RecordNoCosts, false, false},
	} {
		if tt.r.Records(true) != tt.fromDescriptor || tt.r.Records(false) != tt.fromOthers {
			t.Errorf("%s: records a descriptor's cost %v, another %v; want %v, %v",
				tt.r, tt.r.Records(true), tt.r.Records(false), tt.fromDescriptor, tt.fromOthers)
		}
		if got, err := ParseCostRecording(tt.r.String()); err != nil || got != tt.r {
			t.Errorf("ParseCostRecording(%q) = %v, %v", tt.r, got, err)
		}
	}
}

// TestGCRABurst: a gcra rule's bucket is its burst, or a full window's
// worth; burst is accepted on a rule whose algorithm is gcra by default.
func TestGCRABurst(t *testing.T) {
	for _, tt := range []struct {
		name     string
		yaml     string
		defaults Defaults
		want     string // algorithm and burst
	}{
		{"explicit", "{unit: second, requests_per_unit: 10, algorithm: gcra, burst: 3}", Defaults{}, "gcra 3"},
		{"default burst", "{unit: minute, requests_per_unit: 60, unit_multiplier: 2, algorithm: gcra}", Defaults{}, "gcra 60"},
		{"default algorithm", "{unit: second, requests_per_unit: 10, burst: 25}", Defaults{Algorithm: GCRA}, "gcra 25"},
		{"default algorithm and burst", "{unit: hour, requests_per_unit: 7}", Defaults{Algorithm: GCRA}, "gcra 7"},
		{"other algorithm overrides the default", "{unit: hour, requests_per_unit: 7, algorithm: fixed_window}",
			Defaults{Algorithm: GCRA}, "fixed_window 0"},
		{"a year's worth", "{unit: day, requests_per_unit: 1, algorithm: gcra, burst: 36500}", Defaults{}, "gcra 36500"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("d.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tt.yaml+"\n"), tt.defaults)
			if err != nil {
				t.Fatal(err)
			}
			r := c.Rules()[0]
			if got := fmt.Sprint(r.Algorithm, " ", r.Burst); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.yml"), "domain: b\n")
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	writeFile(t, filepath.Join(dir, "notes.txt"), "not yaml: [")
	writeFile(t, filepath.Join(dir, "a.yaml.bak"), "not yaml: [")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "not yaml: [")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "sub.yaml", "c.yaml"), "domain: c\n")

	c, err := Load(dir, Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yml")}
	if got := c.Files(); !slices.Equal(got, want) {
		t.Errorf("Files() = %q, want %q", got, want)
	}
	if !c.HasDomain("a") || !c.HasDomain("b") || c.HasDomain("c") {
		t.Error("want domains a and b only")
	}
}

// TestLoadConfigMap loads the layout of a Kubernetes ConfigMap volume:
//
//	..2024_01_01_00_00_00.1/rules.yaml
//	..data -> ..2024_01_01_00_00_00.1
//	rules.yaml -> ..data/rules.yaml
func TestLoadConfigMap(t *testing.T) {
	dir := t.TempDir()
	const version = "..2024_01_01_00_00_00.1"
	if err := os.Mkdir(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, version, "rules.yaml"), "domain: cm\n")
	for _, l := range []struct{ target, name string }{
		{version, "..data"},
		{filepath.Join("..data", "rules.yaml"), "rules.yaml"},
	} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(t.TempDir(), "mounted")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}

	for _, path := range []string{dir, link} {
		c, err := Load(path, Defaults{})
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{filepath.Join(path, "rules.yaml")}; !slices.Equal(c.Files(), want) || !c.HasDomain("cm") {
			t.Errorf("Load(%s): files %q, want %q with domain cm", path, c.Files(), want)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	empty := t.TempDir()
	writeFile(t, filepath.Join(empty, "README.md"), "no config here")
	for _, tt := range []struct {
		path, want string
	}{
		{filepath.Join(empty, "missing.yaml"), "no such file or directory"},
		{empty, "no *.yaml or *.yml files"},
	} {
		if _, err := Load(tt.path, Defaults{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%s) error = %v, want %q", tt.path, err, tt.want)
		}
	}
}

// TestDefaultReferenceOneLimit: with reference_fixed_window the default (the
// reference's environment), a descriptor's rate_limits may hold one limit
// naming no algorithm; a second one is refused as if it named it.
func TestDefaultReferenceOneLimit(t *testing.T) {
	defaults := Defaults{Algorithm: ReferenceFixedWindow}
	one := "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n" +
		"      - {unit: minute, requests_per_unit: 5}\n      - {unit: day, requests_per_unit: 50, algorithm: gcra}\n"
	c, err := Parse("one.yaml", []byte(one), defaults)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Rules()[0].Algorithm; got != ReferenceFixedWindow {
		t.Errorf("the rule naming no algorithm has %v, want reference_fixed_window", got)
	}
	two := strings.Replace(one, ", algorithm: gcra", "", 1)
	_, err = Parse("two.yaml", []byte(two), defaults)
	if err == nil || !strings.Contains(err.Error(), "one limit of algorithm reference_fixed_window") {
		t.Errorf("two limits of the default reference_fixed_window: error %v", err)
	}
}

// TestHotKeySlicesOptOut: hot_key_slices: false keeps a rule off hot keys'
// slices; the rules that do not say so may be leased.
func TestHotKeySlicesOptOut(t *testing.T) {
	cfg, err := Load("testdata/valid/extensions.yaml", Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg.Rules() {
		if want := r.Levels[len(r.Levels)-1].Key == "bulk"; r.NoSlices != want {
			t.Errorf("%v: NoSlices %v, want %v", r, r.NoSlices, want)
		}
	}
}

// TestGlobalRules: global: true makes a rule's limit one across regions,
// with its regional share (0 unless said) and what a cut region does
// (share unless said); other rules have none.
func TestGlobalRules(t *testing.T) {
	cfg, err := Load("testdata/global/global.yaml", Defaults{Regions: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*Global{
		"plan":           {Share: 0, WhenCut: CutShare},
		"upstream_quota": {Share: 0.1, WhenCut: CutFailureMode},
		"per_second":     {Share: 0.2, WhenCut: CutDeny},
	}
	rules := cfg.Rules()
	if len(rules) != len(want) {
		t.Fatalf("%d rules", len(rules))
	}
	for _, r := range rules {
		key := r.Levels[len(r.Levels)-1].Key
		if w := want[key]; r.Global == nil || *r.Global != *w {
			t.Errorf("%s: Global %+v, want %+v", key, r.Global, w)
		}
	}
	cfg, err = Load("testdata/valid/minimal.yaml", Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg.Rules() {
		if r.Global != nil {
			t.Errorf("%v: Global %+v in a file that names none", r, r.Global)
		}
	}
	// Without a ledger a global rule is refused (global_no_ledger.yaml); with
	// more regions than the regional shares leave room for, too.
	if _, err := Load("testdata/global/global.yaml", Defaults{Regions: 6}); err == nil ||
		!strings.Contains(err.Error(), "global.yaml:10: regional_share 0.2 for each of 6 regions is more than the limit") {
		t.Errorf("six regions of a fifth each: %v", err)
	}
}
