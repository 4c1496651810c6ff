package main

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestRegionsConfig: the regions run's config loads with regions, its
// global rule the global limit with its share, its regional twin the same
// numbers, and it is refused without regions (the service would refuse it).
func TestRegionsConfig(t *testing.T) {
	path := t.TempDir() + "/regions.yaml"
	if err := os.WriteFile(path, []byte(regionsConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(path, config.Defaults{}); err == nil {
		t.Error("loaded without regions")
	}
	cfg, err := config.Load(path, config.Defaults{Regions: len(regionsNames)})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range regionsAlgorithms {
		for _, key := range []string{"global_" + a.Name, "regional_" + a.Name} {
			r := config.Match(cfg, "regions", []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: "acme"}})
			if r == nil || r.RequestsPerUnit != regionsLimit || r.Window() != regionsWindow || r.Algorithm.String() != a.Config {
				t.Fatalf("%s: %+v", key, r)
			}
			if global := key == "global_"+a.Name; (r.Global != nil) != global || global && r.Global.Share != regionsShare {
				t.Errorf("%s: Global %+v", key, r.Global)
			}
		}
	}
	names := func(algs []Algorithm) string {
		var out []string
		for _, a := range algs {
			out = append(out, a.Name)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		run      string
		duration time.Duration
		want     string
	}{
		{"", time.Minute, "log counter fixed"},
		{"^regions/(log|fixed)", time.Minute, "log fixed"},
		{"", 0, ""},
		{"^seats/", time.Minute, ""},
	} {
		if got, err := selectRegions(tc.run, tc.duration); err != nil || names(got) != tc.want {
			t.Errorf("selectRegions(%q, %v): %q, %v; want %q", tc.run, tc.duration, names(got), err, tc.want)
		}
	}
}

// TestRegionsPhaseMeasure: a phase counts what was answered within it, the
// most certainly within one window, and each whole window's use after its
// first.
func TestRegionsPhaseMeasure(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration, n int, latency time.Duration) []regionAdmission {
		out := make([]regionAdmission, n)
		for i := range out {
			out[i] = regionAdmission{sent: t0.Add(d), answered: t0.Add(d + latency)}
		}
		return out
	}
	var all []regionAdmission
	all = append(all, at(time.Second, 300, time.Millisecond)...)                 // first window
	all = append(all, at(regionsWindow+time.Second, 540, time.Millisecond)...)   // second: 90 %
	all = append(all, at(2*regionsWindow+time.Second, 480, time.Millisecond)...) // third: 80 %
	all = append(all, at(-time.Second, 50, 2*time.Second)...)                    // sent before, answered in the first
	p := RegionsPhase{From: t0, To: t0.Add(3 * regionsWindow), Windows: 3}
	p.measure(all)
	if p.Admitted != 300+540+480+50 || p.Most != 540 || p.LeastUse != 0.8 || math.Abs(p.MeanUse-0.85) > 1e-9 || p.MostAligned != 540 {
		t.Errorf("%+v: want 1370 admitted, most 540 (and 540 aligned), least use 80 %%, mean 85 %%", p)
	}
}
