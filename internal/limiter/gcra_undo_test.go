package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestGCRAUndoGivesBackAPartOfAUnit: a one-unit GCRA charge of a slow rule
// (3 a day: a unit is 8 h) undone a moment after its charge (a request
// denied on another store or Cluster slot) gives back the part of its time
// still ahead of now, less than a unit: the bucket is full again. Until
// 2026-12-04 the undo gave back whole units only, none here: the denied
// request kept a unit charged for 8 h (e2e TestClusterMultiSlotAllOrNothing
// failed when its deny cache entry had expired).
func TestGCRAUndoGivesBackAPartOfAUnit(t *testing.T) {
	for _, after := range []time.Duration{0, time.Millisecond, time.Hour} {
		t.Run(after.String(), func(t *testing.T) {
			s, main, _ := newTestSplit(t, epoch.Add(100*time.Millisecond))
			counter := hit(config.GCRA, "slow", 3, 24*time.Hour, 1)
			v, err := s.main.Decide(context.Background(), []Hit{counter})
			if err != nil || !v[0].Charged {
				t.Fatalf("the charge: %+v, %v", v, err)
			}
			main.add(after)
			gate := hit(config.GCRA, "gate", 1, time.Second, 1)
			hits, verdicts := []Hit{counter, gate}, []Verdict{v[0], {}}
			s.main.undo(context.Background(), "test", hits, []int{0}, verdicts, takenBack(hits, verdicts))
			s.awaitRefunds()
			probe := counter
			probe.Cost = 3
			if got := decideSplit(t, s, probe); !got.Admitted {
				t.Fatalf("%v after the charge, its undo left the bucket short of 3: %+v", after, got)
			}
		})
	}
}
