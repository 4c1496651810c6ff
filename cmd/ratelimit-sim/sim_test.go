package main

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

const sec = int64(time.Second / time.Microsecond)

// TestExactReference checks the reference on a hand-computed trace: the
// window is (t - window, t], costs add up, denials are not counted.
func TestExactReference(t *testing.T) {
	t0 := start.UnixMicro()
	tr := &Trace{Name: "hand", Clients: 2, Requests: []Request{
		{At: t0, Client: 0, Cost: 1},                    // 1 in the window: admitted
		{At: t0 + 1*sec, Client: 0, Cost: 2},            // 3: admitted
		{At: t0 + 2*sec, Client: 0, Cost: 1},            // 4 > 3: denied, not counted
		{At: t0 + 2*sec + 1, Client: 1, Cost: 3},        // another client: admitted
		{At: t0 + 10*sec, Client: 0, Cost: 1},           // t0 left (t0 <= t - 10s): 2 + 1, admitted
		{At: t0 + 11*sec - 1, Client: 0, Cost: 1},       // 2 (at 1s) + 1 (at 10s) + 1 > 3: denied
		{At: t0 + 11*sec, Client: 0, Cost: 2},           // the cost 2 at 1s left: 1 + 2, admitted
		{At: t0 + 12*sec + 2, Client: 1, Cost: 3},       // client 1's 3 left: admitted
		{At: t0 + 12*sec + 3, Client: 1, Cost: 0},       // cost 0 fits a full window
		{At: t0 + 20*sec + 999_999, Client: 0, Cost: 2}, // (10.999999s, 20.999999s] holds 2 (at 11s): denied
	}}
	p := Params{Limit: 3, Window: 10 * time.Second}
	res, got := runReference(tr, p)
	want := []bool{true, true, false, true, true, false, true, true, true, false}
	if !slices.Equal(got, want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
	if res.Admitted != 7 || res.MaxWindow != 3 {
		t.Fatalf("admitted %d, max window %d; want 7 and 3", res.Admitted, res.MaxWindow)
	}
}

// TestScoreCountsWrongDecisions checks the primary metric against deciders
// that are wrong on purpose.
func TestScoreCountsWrongDecisions(t *testing.T) {
	p := Params{Limit: 5, Window: 10 * time.Second}
	g := &gen{p: p}
	tr := &Trace{Name: "burst", Clients: 1, Requests: g.burst(start.UnixMicro(), sec, 12, 0)}
	_, ref := runReference(tr, p)

	all := newScore(tr, p, "admit all", ref)
	none := newScore(tr, p, "deny all", ref)
	for i, r := range tr.Requests {
		all.add(i, r, true)
		none.add(i, r, false)
	}
	// Admitting all: the 7 past the limit are wrong, and one window holds 12.
	if r := all.res; r.WrongAdmits != 7 || r.WrongDenies != 0 || r.MaxWindow != 12 || r.ExtraAdmits != 7 || r.MissingAdmits != 0 {
		t.Fatalf("admit all: %+v", r)
	}
	// Denying all: with nothing admitted, every request would have fit.
	if r := none.res; r.WrongAdmits != 0 || r.WrongDenies != 12 || r.MaxWindow != 0 || r.ExtraAdmits != 0 || r.MissingAdmits != 5 {
		t.Fatalf("deny all: %+v", r)
	}
}

// bruteMaxWindow recomputes the worst window of an admitted history the slow
// way: for every admitted request, the cost of its client's admitted
// requests in (t - window, t].
func bruteMaxWindow(tr *Trace, admitted []bool, w time.Duration) uint64 {
	var worst uint64
	for j, rj := range tr.Requests {
		if !admitted[j] {
			continue
		}
		var sum uint64
		for i := 0; i <= j; i++ {
			ri := tr.Requests[i]
			if admitted[i] && ri.Client == rj.Client && ri.At > rj.At-w.Microseconds() {
				sum += uint64(ri.Cost)
			}
		}
		worst = max(worst, sum)
	}
	return worst
}

// TestReferenceNeverOverAdmits runs the reference alone on every trace:
// no window may ever hold more than the limit.
func TestReferenceNeverOverAdmits(t *testing.T) {
	for _, p := range []Params{
		{Limit: 10, Window: 10 * time.Second, Duration: 2 * time.Minute, Seed: 1, Clients: 30},
		{Limit: 1, Window: time.Second, Duration: time.Minute, Seed: 2, Clients: 5},
		{Limit: 100, Window: 60 * time.Second, Duration: 5 * time.Minute, Seed: 3, Clients: 50},
	} {
		for _, name := range traceNames {
			tr, err := makeTrace(name, p)
			if err != nil {
				t.Fatal(err)
			}
			res, decisions := runReference(tr, p)
			if res.MaxWindow > uint64(p.Limit) {
				t.Errorf("%s %+v: the reference admitted %d in one window", name, p, res.MaxWindow)
			}
			if len(tr.Requests) <= 3000 {
				if brute := bruteMaxWindow(tr, decisions, p.Window); brute != res.MaxWindow {
					t.Errorf("%s %+v: max window %d, brute force %d", name, p, res.MaxWindow, brute)
				}
			}
		}
	}
}

// TestTraces checks that traces are deterministic, seeded, in strictly
// increasing time, and costed within the limit.
func TestTraces(t *testing.T) {
	p := Params{Limit: 10, Window: 10 * time.Second, Duration: 2 * time.Minute, Seed: 7, Clients: 20}
	for _, name := range traceNames {
		a, _ := makeTrace(name, p)
		b, _ := makeTrace(name, p)
		if len(a.Requests) == 0 || !slices.Equal(a.Requests, b.Requests) {
			t.Fatalf("%s: empty or not deterministic", name)
		}
		for i, r := range a.Requests {
			if i > 0 && r.At <= a.Requests[i-1].At {
				t.Fatalf("%s: request %d at %d, not after %d", name, i, r.At, a.Requests[i-1].At)
			}
			if r.Cost < 1 || r.Cost > p.Limit || r.Client < 0 || r.Client >= a.Clients {
				t.Fatalf("%s: request %d: %+v", name, i, r)
			}
		}
		q := p
		q.Seed++
		if c, _ := makeTrace(name, q); !strings.HasPrefix(name, "edge") && slices.Equal(a.Requests, c.Requests) {
			t.Fatalf("%s: the seed changes nothing", name)
		}
	}
	if _, err := makeTrace("nope", p); err == nil {
		t.Fatal("unknown trace accepted")
	}
}

func runOne(t *testing.T, name string, p Params, a config.Algorithm) Result {
	t.Helper()
	tr, err := makeTrace(name, p)
	if err != nil {
		t.Fatal(err)
	}
	ref, decisions := runReference(tr, p)
	if ref.MaxWindow > uint64(p.Limit) {
		t.Fatalf("%s: the reference admitted %d in one window", name, ref.MaxWindow)
	}
	res, err := runAlgorithm(context.Background(), tr, p, a, decisions)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s: %+v", name, a, res)
	return res
}

// TestLogIsExact replays every trace through the sliding log's script: not
// one decision may differ from the exact window's.
func TestLogIsExact(t *testing.T) {
	for _, p := range []Params{
		{Limit: 10, Window: 10 * time.Second, Duration: time.Minute, Seed: 1, Clients: 20},
		{Limit: 3, Window: 2 * time.Second, Duration: 20 * time.Second, Seed: 2, Clients: 5},
	} {
		for _, name := range traceNames {
			r := runOne(t, name, p, config.SlidingWindowLog)
			if r.WrongAdmits != 0 || r.WrongDenies != 0 || r.ExtraAdmits != 0 || r.MissingAdmits != 0 || r.MaxWindow > uint64(p.Limit) {
				t.Errorf("%s %+v: the log is not exact: %+v", name, p, r)
			}
		}
	}
}

// TestEdgeOverAdmission is the seeds' boundary burst, measured: the fixed
// window passes twice the limit in one window, the counter more than the
// limit but less than twice it, the log exactly the limit.
func TestEdgeOverAdmission(t *testing.T) {
	p := Params{Limit: 20, Window: 10 * time.Second, Duration: 90 * time.Second, Seed: 1, Clients: 1}
	if got := runOne(t, "edge", p, config.FixedWindow).WorstOverAdmission(); got != 2 {
		t.Errorf("fixed window: worst window %.2fx the limit, want 2.00x", got)
	}
	if got := runOne(t, "edge", p, config.SlidingWindowCounter).WorstOverAdmission(); got <= 1 || got >= 2 {
		t.Errorf("sliding counter: worst window %.2fx the limit, want above 1x and below 2x", got)
	}
	if got := runOne(t, "edge", p, config.SlidingWindowLog).WorstOverAdmission(); got != 1 {
		t.Errorf("sliding log: worst window %.2fx the limit, want 1.00x", got)
	}
}

// TestGCRAWorstWindow: a bucket of burst units, refilled at the limit per
// window, passes at most burst + limit in any window (a full bucket, then a
// window's refill), and comes near that bound on edge-flood, whose bursts
// come after idle windows.
func TestGCRAWorstWindow(t *testing.T) {
	for _, burst := range []uint32{0, 5} { // 0: the limit
		p := Params{Limit: 20, Window: 10 * time.Second, Duration: 90 * time.Second, Seed: 1, Clients: 20, Burst: burst}
		bound := float64(cmp.Or(burst, p.Limit)+p.Limit) / float64(p.Limit)
		for _, name := range traceNames {
			if got := runOne(t, name, p, config.GCRA).WorstOverAdmission(); got > bound {
				t.Errorf("burst %d, %s: worst window %.2fx the limit, want at most %.2fx", burst, name, got, bound)
			}
		}
		if got := runOne(t, "edge-flood", p, config.GCRA).WorstOverAdmission(); got < bound-0.1 {
			t.Errorf("burst %d, edge-flood: worst window %.2fx the limit, want near %.2fx", burst, got, bound)
		}
	}
}

// TestRun runs the command on a small trace and checks its table.
func TestRun(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"-limit", "10", "-window", "10s", "-duration", "1m", "-clients", "5", "-trace", "edge,many-clients"}
	if code := run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{
		"| trace | algorithm | requests | admitted | wrongly admitted | wrongly denied | worst window |",
		"| edge | exact reference | 40 | 20 | - | - | 1.00x | - |",
		"| edge | sliding_window_log | 40 | 20 | 0 (0.0000%) | 0 (0.0000%) | 1.00x | 0 / 0 |",
		"| edge | fixed_window | 40 | 40 | 20 (50.0000%) | 0 (0.0000%) | 2.00x | 20 / 0 |",
		"-trace edge,many-clients`",
		"| many-clients | sliding_window_log |",
		"| 1x the limit and above | 2 | ",
		"| 0.5x to 1x the limit | 2 | ",
		"| below 0.5x the limit | 1 | ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range [][]string{
		{"-window", "1500ms"},
		{"-limit", "0"},
		{"-trace", "nope"},
		{"-duration", "1s"},
		{"extra"},
	} {
		errOut.Reset()
		if code := run(context.Background(), bad, &out, &errOut); code == 0 {
			t.Errorf("%q: exit 0", bad)
		}
	}
}

// TestBands checks the split of wrong decisions by client rate.
func TestBands(t *testing.T) {
	p := Params{Limit: 1, Window: 10 * time.Second}
	t0 := start.UnixMicro()
	tr := &Trace{Name: "bands", Clients: 4, Rates: []float64{2, 1, 0.5, 0.1}, Requests: []Request{
		{At: t0, Client: 0, Cost: 1}, {At: t0 + 1, Client: 0, Cost: 1}, // the second is over the limit
		{At: t0 + 2, Client: 1, Cost: 1},
		{At: t0 + 3, Client: 2, Cost: 1}, {At: t0 + 4, Client: 2, Cost: 1},
		{At: t0 + 5, Client: 3, Cost: 1},
	}}
	_, ref := runReference(tr, p)
	s := newScore(tr, p, "admit all", ref)
	for i, r := range tr.Requests {
		s.add(i, r, true)
	}
	want := [len(bands)]Band{{Clients: 2, Requests: 3, Wrong: 1}, {Clients: 1, Requests: 2, Wrong: 1}, {Clients: 1, Requests: 1}}
	if s.res.Bands != want {
		t.Fatalf("bands %+v, want %+v", s.res.Bands, want)
	}
}
