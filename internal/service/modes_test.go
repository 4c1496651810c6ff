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

// recordingDecider admits every hit and keeps the hits it was given.
type recordingDecider struct{ hits []decision.Hit }

func (r *recordingDecider) Decide(_ context.Context, hits []decision.Hit) ([]limiter.Verdict, error) {
	r.hits = append([]decision.Hit(nil), hits...)
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
