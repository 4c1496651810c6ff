package xdsconfig

import (
	"fmt"
	"math"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// envoyGatewayStyle is shaped as Envoy Gateway's translator builds its
// resources: the resource named after the domain, one descriptor chain per
// rule, a header match under a rule key.
func envoyGatewayStyle() *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   "default/eg/http",
		Domain: "default/eg/http",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:   "httproute/default/backend/rule/0/match/0",
			Value: "httproute/default/backend/rule/0/match/0",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key:        "rule-0-match-0",
				Value:      "one",
				RateLimit:  &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 3, Name: "hourly"},
				ShadowMode: true,
			}, {
				Key:       "rule-0-match-1",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Replaces: []*rlsconfv3.RateLimitReplace{{Name: "hourly"}}},
			}},
		}, {
			Key:            "masked_remote_address",
			Value:          "10.0.0.0/8",
			RateLimit:      &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_WEEK, RequestsPerUnit: 7},
			DetailedMetric: true,
		}},
	}
}

func TestDocument(t *testing.T) {
	got, err := document(envoyGatewayStyle())
	if err != nil {
		t.Fatal(err)
	}
	const want = `domain: default/eg/http
descriptors:
    - key: httproute/default/backend/rule/0/match/0
      value: httproute/default/backend/rule/0/match/0
      descriptors:
        - key: rule-0-match-0
          value: one
          rate_limit:
            unit: hour
            requests_per_unit: 3
            name: hourly
          shadow_mode: true
        - key: rule-0-match-1
          rate_limit:
            unlimited: true
            replaces:
                - name: hourly
    - key: masked_remote_address
      value: 10.0.0.0/8
      rate_limit:
        unit: week
        requests_per_unit: 7
      detailed_metric: true
`
	if string(got) != want {
		t.Errorf("document:\n%s\nwant:\n%s", got, want)
	}
}

func anys(t *testing.T, msgs ...proto.Message) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(msgs))
	for i, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

func TestBuild(t *testing.T) {
	eg := envoyGatewayStyle()
	other := &rlsconfv3.RateLimitConfig{Name: "a-first", Domain: "other", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1},
	}}}
	c, err := Build(anys(t, eg, other), config.Defaults{Algorithm: config.FixedWindow})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Rules() {
		got = append(got, r.String()+" @"+r.Source)
	}
	want := []string{
		"default/eg/http: httproute/default/backend/rule/0/match/0=httproute/default/backend/rule/0/match/0 / rule-0-match-0=one @xds/default/eg/http:6",
		"default/eg/http: httproute/default/backend/rule/0/match/0=httproute/default/backend/rule/0/match/0 / rule-0-match-1 @xds/default/eg/http:13",
		"default/eg/http: masked_remote_address=10.0.0.0/8 @xds/default/eg/http:18",
		"other: k @xds/a-first:3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	r := c.Rules()[0]
	if r.Unit != config.Hour || r.RequestsPerUnit != 3 || r.Name != "hourly" || !r.ShadowMode || r.Algorithm != config.FixedWindow {
		t.Errorf("first rule %+v", r)
	}
	if r := c.Rules()[1]; !r.Unlimited || len(r.Replaces) != 1 || r.Replaces[0] != "hourly" {
		t.Errorf("second rule %+v", r)
	}
	if r := c.Rules()[2]; r.Unit != config.Week || !r.DetailedMetric {
		t.Errorf("third rule %+v", r)
	}
	// The documents are read in name order: "a-first" comes first whatever
	// the order of the response, and the hash does not change with it.
	if files := c.Files(); len(files) != 2 || files[0] != "xds/a-first" {
		t.Errorf("files %q", files)
	}
	swapped, err := Build(anys(t, other, eg), config.Defaults{Algorithm: config.FixedWindow})
	if err != nil || swapped.Hash() != c.Hash() {
		t.Errorf("the same resources in another order: %v, hash %q, want %q", err, swapped.Hash(), c.Hash())
	}

	empty, err := Build(nil, config.Defaults{})
	if err != nil || len(empty.Rules()) != 0 {
		t.Errorf("no resources: %v, %d rules, want an empty config", err, len(empty.Rules()))
	}
}

func TestBuildRefuses(t *testing.T) {
	rule := func(p *rlsconfv3.RateLimitPolicy) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: "n", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: p}}}
	}
	notConfig, err := anypb.New(wrapperspb.String("x"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		res  []*anypb.Any
		want string
	}{
		{"unit unknown", anys(t, rule(&rlsconfv3.RateLimitPolicy{RequestsPerUnit: 5})), "xds/n:3: rate_limit unit is missing"},
		{"unit out of the enum", anys(t, rule(&rlsconfv3.RateLimitPolicy{Unit: 42, RequestsPerUnit: 5})),
			"xds/n: descriptors: rate_limit: unit: unknown value 42"},
		{"unlimited with a unit", anys(t, rule(&rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_SECOND})),
			"xds/n:5: should not specify rate limit unit when unlimited"},
		{"no domain", anys(t, &rlsconfv3.RateLimitConfig{Name: "n"}), "xds/n:1: domain is missing"},
		{"no name", anys(t, &rlsconfv3.RateLimitConfig{Domain: "d"}), `resource 0 (domain "d"): the name is empty`},
		{"two of one name", anys(t, rule(&rlsconfv3.RateLimitPolicy{Unlimited: true}), rule(&rlsconfv3.RateLimitPolicy{Unlimited: true})),
			`two resources are named "n"`},
		{"two of one domain", anys(t, &rlsconfv3.RateLimitConfig{Name: "a", Domain: "d"}, &rlsconfv3.RateLimitConfig{Name: "b", Domain: "d"}),
			`xds/b:1: domain "d" already defined in xds/a:1`},
		{"another type", []*anypb.Any{notConfig}, `resource 0: type "type.googleapis.com/google.protobuf.StringValue"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(tt.res, config.Defaults{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestBuildQuotaModeAndMetadata: RateLimitConfig carries quota_mode and
// metadata on descriptors; the config format accepts them once the config
// format work of issue 11 is merged.
func TestBuildQuotaModeAndMetadata(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"team": "payments", "tier": 2})
	if err != nil {
		t.Fatal(err)
	}
	rc := &rlsconfv3.RateLimitConfig{Name: "q", Domain: "q", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key:       "user",
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 100},
		QuotaMode: true,
		Metadata:  meta,
	}}}
	doc, err := document(rc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "quota_mode: true\n") || !strings.Contains(string(doc), "team: payments\n") {
		t.Errorf("document:\n%s", doc)
	}
	c, err := Build(anys(t, rc), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules()) != 1 {
		t.Fatalf("%d rules, want 1", len(c.Rules()))
	}
}

// TestBuildMetadataRoundTrips: a resource's metadata reaches the rule as
// the reference passes it through (structpb's AsMap, then NewStruct): keys
// YAML would read as something else ("<<" a merge key, "yes" a boolean,
// "null" null) stay the keys they are, and so do such values; a NaN or an
// infinity, which AsMap turns into its name, arrives as that string.
func TestBuildMetadataRoundTrips(t *testing.T) {
	for _, tt := range []struct {
		name string
		md   map[string]any
	}{
		{"merge key, a mapping", map[string]any{"<<": map[string]any{"x": "y"}, "x": "own"}},
		{"merge key, a scalar", map[string]any{"<<": "v"}},
		{"merge key, a list", map[string]any{"<<": []any{map[string]any{"a": "b"}, "c"}}},
		{"merge key, nested", map[string]any{"nested": map[string]any{"<<": map[string]any{"a": "b"}}, "list": []any{map[string]any{"<<": nil}}}},
		{"merge key as a value", map[string]any{"m": "<<", "l": []any{"<<"}}},
		{"words YAML reads otherwise", map[string]any{
			"yes": "yes", "on": "off", "Y": "n", "null": "null", "~": "~", "true": "true", "1": "1", "0x10": "0x10",
			"1e3": "1e3", ".nan": ".nan", "-.inf": "-.inf", "2001-12-14": "2001-12-14", "": "", " x ": " x ", "a\nb": "a\nb",
			"*": "*", "&a": "&a", "!x": "!x", "#": "#", "- a": "- a", "a: b": "a: b", "'q'": "'q'", "\"": "\"", "\t": "\t", "é": "é",
		}},
		{"values", map[string]any{"num": 1.5, "big": 1e21, "int": 12345678901234567890.0, "neg": -3.0, "t": true, "f": false, "nil": nil,
			"list": []any{"on", 2.0, nil, true, []any{}, map[string]any{}}}},
		{"NaN and infinities", map[string]any{"nan": math.NaN(), "inf": []any{math.Inf(1), math.Inf(-1)}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			md, err := structpb.NewStruct(tt.md)
			if err != nil {
				t.Fatal(err)
			}
			rc := &rlsconfv3.RateLimitConfig{Name: "n", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}, Metadata: md,
			}}}
			want, err := structpb.NewStruct(md.AsMap())
			if err != nil {
				t.Fatal(err)
			}
			doc, _ := document(rc)
			c, err := Build(anys(t, rc), config.Defaults{})
			if err != nil {
				t.Fatalf("%v\ndocument:\n%s", err, doc)
			}
			if got := c.Rules()[0].Metadata; !proto.Equal(got, want) {
				t.Errorf("metadata\n got %v\nwant %v\ndocument:\n%s", got, want, doc)
			}
		})
	}
}

// TestBuildStringsRoundTrip: descriptor keys and values, domains and names
// that YAML could read as something else reach the rule unchanged.
func TestBuildStringsRoundTrip(t *testing.T) {
	for _, s := range []string{
		"<<", "yes", "off", "null", "~", "1", "0x1F", ".nan", "*", "&a", "!x", "- a", "a: b", "#", "'q'", "\"", "\t", "é", "=", "true",
	} {
		rc := &rlsconfv3.RateLimitConfig{Name: "n", Domain: s, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: s, Value: s, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1, Name: s},
		}}}
		c, err := Build(anys(t, rc), config.Defaults{})
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		r := c.Rules()[0]
		if r.Domain != s || len(r.Levels) != 1 || r.Levels[0].Key != s || r.Levels[0].Value != s || r.Name != s {
			t.Errorf("%q: rule %+v", s, r)
		}
	}
}

// TestBuildSeveralLimits: sibling descriptors with one key and value, each
// with its rate_limit, are one descriptor with both limits (rate_limits),
// their children joined; siblings that differ otherwise stay duplicates.
func TestBuildSeveralLimits(t *testing.T) {
	limit := func(unit rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
	}
	rc := &rlsconfv3.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "user", RateLimit: limit(rlsconfv3.RateLimitUnit_SECOND, 10)},
		{Key: "user", RateLimit: limit(rlsconfv3.RateLimitUnit_DAY, 1000), Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "path", RateLimit: limit(rlsconfv3.RateLimitUnit_MINUTE, 5)},
		}},
		{Key: "other", RateLimit: limit(rlsconfv3.RateLimitUnit_HOUR, 7)},
	}}
	c, err := Build(anys(t, rc), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	user := config.Match(c, "api", []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}})
	if user == nil {
		t.Fatal("user: no rule")
	}
	var got []string
	for _, l := range user.Limits() {
		got = append(got, fmt.Sprint(l.RequestsPerUnit, "/", l.Unit))
	}
	if strings.Join(got, " ") != "10/SECOND 1000/DAY" {
		t.Errorf("user's limits %q, want 10/SECOND and 1000/DAY", got)
	}
	entries := []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}, {Key: "path", Value: "/"}}
	if r := config.Match(c, "api", entries); r == nil || r.RequestsPerUnit != 5 {
		t.Errorf("user / path: %v, want the child of the second sibling", r)
	}
	if r := config.Match(c, "api", []*rlcommon.RateLimitDescriptor_Entry{{Key: "other", Value: "o"}}); r == nil || r.RequestsPerUnit != 7 {
		t.Errorf("other: %v", r)
	}

	shadow := &rlsconfv3.RateLimitConfig{Name: "api", Domain: "api", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "user", RateLimit: limit(rlsconfv3.RateLimitUnit_SECOND, 10)},
		{Key: "user", RateLimit: limit(rlsconfv3.RateLimitUnit_DAY, 1000), ShadowMode: true},
	}}
	if _, err := Build(anys(t, shadow), config.Defaults{}); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("siblings that differ in shadow_mode: %v, want refused as duplicates", err)
	}
}
