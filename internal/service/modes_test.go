package service

import (
	"context"
	"fmt"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

const modesConfig = `
domain: modes
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
`

// recordingDecider admits every hit and keeps the request it was given.
type recordingDecider struct {
	hits   []limiter.Hit
	routes []decision.Route
}

func (r *recordingDecider) Decide(_ context.Context, req decision.Request) ([]limiter.Verdict, error) {
	hits := req.Hits
	r.hits, r.routes = append([]limiter.Hit(nil), hits...), req.Routes
	verdicts := make([]limiter.Verdict, len(hits))
	for i := range verdicts {
		verdicts[i] = limiter.Verdict{Admitted: true, Charged: true}
	}
	return verdicts, nil
}

// TestGlobalModesAreHitFlags: the global modes reach the limiter as the
// hits' Shadow and Quota flags (applyModes), beside the rules' own.
func TestGlobalModesAreHitFlags(t *testing.T) {
	cfg, err := config.Parse("modes.yaml", []byte(modesConfig), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		shadow, quot bool
		keys         []string
		want         string // per hit: s (shadow), q (quota), sq (both: shadow wins), - (neither)
	}{
		{"rules alone", false, false, []string{"plain", "shadow", "quota", "free"}, "- s q"},
		{"shadow mode", true, false, []string{"plain", "shadow", "quota"}, "s s sq"},
		{"quota mode", false, true, []string{"plain", "free"}, "q"},
		{"quota mode, a shadow rule's quota passes", false, true, []string{"plain", "shadow", "free"}, "s s"},
		{"quota mode, a descriptor without a rule passes", false, true, []string{"plain", "nothing"}, "s"},
		{"a quota descriptor in shadow mode passes", false, false, []string{"plain", "quota", "shadow"}, "- q s"},
		{"both modes", true, true, []string{"plain", "quota"}, "sq sq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &recordingDecider{}
			s := New(cfg, d, &Options{ShadowMode: tc.shadow, QuotaMode: tc.quot})
			req := &rlsv3.RateLimitRequest{Domain: "modes"}
			for _, k := range tc.keys {
				req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
					Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: "v"}}})
			}
			if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			got := ""
			for i, h := range d.hits {
				if i > 0 {
					got += " "
				}
				switch {
				case h.Shadow && h.Quota:
					got += "sq"
				case h.Shadow:
					got += "s"
				case h.Quota:
					got += "q"
				default:
					got += "-"
				}
			}
			if got != tc.want {
				t.Errorf("hit flags %q, want %q (hits %s)", got, tc.want, fmt.Sprint(d.hits))
			}
		})
	}
}

// TestAdminInspectUnderGlobalShadowMode: Inspect shows the global shadow
// mode on every rule, the unlimited one too, and inspects with a shadow hit.
func TestAdminInspectUnderGlobalShadowMode(t *testing.T) {
	_, a, _ := newAdminTest(t, &Options{ShadowMode: true})
	for _, key := range []string{"counter", "free"} {
		if resp := inspect(t, a, key, "x"); !resp.ShadowMode {
			t.Errorf("%s: ShadowMode false under the global shadow mode", key)
		}
	}
	target, err := a.find("adm", adminEntries("counter", "x"))
	if err != nil || !target.hit.Shadow {
		t.Fatalf("inspected hit %+v, %v: want a shadow hit", target.hit, err)
	}
}

const routesConfig = `
domain: routes
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: bulk
    rate_limit: {unit: minute, requests_per_unit: 5, hot_key_slices: false}
  - key: seat
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_log, leases: true}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 1000, global: true, regional_share: 0.2}
`

// TestRoutes: each hit's route says what its rule asks of the layers over
// the limiter: a global rule's its global, hot_key_slices: false's and a
// seat's no slices; a request of plain rules routes none (nil).
func TestRoutes(t *testing.T) {
	cfg, err := config.Parse("routes.yaml", []byte(routesConfig), config.Defaults{Regions: 3})
	if err != nil {
		t.Fatal(err)
	}
	plan := &config.Global{Share: 0.2, WhenCut: config.CutShare}
	for _, tc := range []struct {
		name string
		keys []string
		want []decision.Route // nil: none routed
	}{
		{"plain rules", []string{"plain", "plain", "nothing"}, nil},
		{"no slices", []string{"plain", "bulk", "nothing", "plain"}, []decision.Route{{}, {NoSlices: true}, {}}},
		{"a seat", []string{"seat"}, []decision.Route{{NoSlices: true}}},
		{"global", []string{"plan", "plain"}, []decision.Route{{Global: plan}, {}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &recordingDecider{}
			s := New(cfg, d, nil)
			req := &rlsv3.RateLimitRequest{Domain: "routes"}
			for _, k := range tc.keys {
				req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
					Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: "v"}}})
			}
			if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if d.routes != nil {
					t.Errorf("routes %+v, want none", d.routes)
				}
				return
			}
			if len(d.routes) != len(d.hits) || len(d.routes) != len(tc.want) {
				t.Fatalf("%d routes for %d hits, want %d", len(d.routes), len(d.hits), len(tc.want))
			}
			for i, w := range tc.want {
				got := d.routes[i]
				if got.NoSlices != w.NoSlices || (got.Global == nil) != (w.Global == nil) || got.Global != nil && *got.Global != *w.Global {
					t.Errorf("hit %d (%s): route %+v, want %+v", i, d.hits[i].Key, got, w)
				}
			}
		})
	}
}
