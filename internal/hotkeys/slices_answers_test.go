package hotkeys

import (
	"context"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// TestSliceAnswersAsWithout sends envoyproxy/ratelimit's integration case
// (25 hits of one fresh key under a limit of 20 a minute, one after
// another) through one instance, with slices and without: every answer is
// the same, admitted or not, remaining and reset, though the instance
// decides some hits from a slice of units it leased ahead (its own to
// give, so they count as remaining); a log's reset is up to a slice's
// period later, the time its members are recorded ahead. Every seventh
// request of some cases is a refund of a unit (Envoy's is_negative_hits),
// decided on Redis: what it gives back remains, with slices as without.
func TestSliceAnswersAsWithout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   uint32
		hits    int
		step    time.Duration
		refunds bool
	}{
		{"reference's key2, 25 hits", 20, 25, 10 * time.Millisecond, false},
		// Hot for four seconds, slices leased again each period; every
		// tenth request a check (cost 0), decided on Redis.
		{"hot, 400 hits and checks", 1000, 400, 10 * time.Millisecond, false},
		// Slower: slices end with units unused, given back at the ticks.
		{"warm, 200 hits and checks", 1000, 200, 150 * time.Millisecond, false},
		{"reference's key2, 25 hits and refunds", 20, 25, 10 * time.Millisecond, true},
		{"hot, 400 hits, checks and refunds", 1000, 400, 10 * time.Millisecond, true},
		{"warm, 200 hits, checks and refunds", 1000, 200, 150 * time.Millisecond, true},
	} {
		for _, alg := range []config.Algorithm{config.FixedWindow, config.SlidingWindowLog, config.SlidingWindowCounter, config.GCRA} {
			if alg == config.GCRA && time.Minute/tc.step < time.Duration(tc.limit) {
				continue // a GCRA key slower than its pace gets no slice
			}
			t.Run(tc.name+"/"+alg.String(), func(t *testing.T) {
				answersAsWithout(t, limiter.Hit{Key: "{another}:key2", Algorithm: alg, Limit: tc.limit, Window: time.Minute, Cost: 1}, tc.hits, tc.step, tc.refunds)
			})
		}
	}
}

func answersAsWithout(t *testing.T, hit limiter.Hit, hits int, step time.Duration, refunds bool) {
	alg := hit.Algorithm
	with := newInstances(t, 1, SliceOptions{Threshold: 2})
	without := newInstances(t, 1, SliceOptions{Threshold: -1})
	for i := range hits {
		h := hit
		if i%10 == 9 {
			h.Cost = 0
		}
		if refunds && i%7 == 6 {
			h.Refund = true
		}
		var got [2]limiter.Verdict
		for j, in := range []*instances{with, without} {
			if tick := in.now.Truncate(time.Second); tick.After(in.now.Add(-step)) {
				in.slices[0].turn(tick)
			}
			v, err := in.slices[0].Decide(context.Background(), plain(h))
			if err != nil {
				t.Fatal(err)
			}
			got[j] = v[0]
			in.settle()
			in.advance(step)
		}
		w, wo := got[0], got[1]
		// A log's slice records its units at its period's end (see
		// Slices): the window holds the ones used until up to a
		// period later than their hits', and the reset says so.
		// Without slices a refund takes the newest member, a step before,
		// and the reset comes that much earlier.
		late := time.Duration(0)
		if alg == config.SlidingWindowLog {
			most := DefaultSlicePeriod
			if h.Refund {
				most += step
			}
			late = min(max(0, w.ResetAfter-wo.ResetAfter), most)
		}
		if w.Admitted != wo.Admitted || w.Remaining != wo.Remaining || w.ResetAfter-late != wo.ResetAfter {
			t.Errorf("request %d (cost %d): with slices admitted %v, remaining %d, reset %v; without: %v, %d, %v",
				i+1, h.Cost, w.Admitted, w.Remaining, w.ResetAfter, wo.Admitted, wo.Remaining, wo.ResetAfter)
		}
	}
	if with.local.Load() == 0 {
		t.Fatalf("no hit decided from a slice (%d units leased): the case tests nothing", with.leased.Load())
	}
	t.Logf("%d of %d requests decided from a slice, %d units leased, %d given back", with.local.Load(), hits, with.leased.Load(), with.back.Load())
}
