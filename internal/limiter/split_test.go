package limiter

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// newTestSplit is a Split on two fresh miniredis, the main one's clock and
// the per-second one's both at start.
func newTestSplit(t *testing.T, start time.Time) (s *Split, main, perSecond *clock) {
	t.Helper()
	mainLim, main := newTestLimiter(t, start)
	secondLim, perSecond := newTestLimiter(t, start)
	s = NewSplit(mainLim, secondLim)
	t.Cleanup(s.Close)
	return s, main, perSecond
}

// keysOf are the keys a miniredis holds.
func keysOf(c *clock) string { return strings.Join(heldKeys(c), " ") }

// heldKeys is c's keys that hold something: not a counter's or GCRA's state
// as a Reset leaves it, empty but for its generation ("0:0/<generation>",
// reset.lua).
func heldKeys(c *clock) []string {
	return slices.DeleteFunc(c.m.Keys(), func(k string) bool {
		v, err := c.m.Get(k)
		return err == nil && resetState.MatchString(v)
	})
}

var resetState = regexp.MustCompile(`^0:0/[1-9][0-9]*$`)

// TestSplitRoutesByWindow: a hit of a one-second window is counted on the
// per-second store only, every other on the main one only, each in the
// order of the request.
func TestSplitRoutesByWindow(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			s, main, perSecond := newTestSplit(t, epoch.Add(100*time.Millisecond))
			second, minute := hit(a, "u", 3, time.Second, 1), hit(a, "u", 5, time.Minute, 2)
			for i := 1; i <= 2; i++ {
				v, err := s.Decide(context.Background(), []Hit{minute, second})
				if err != nil {
					t.Fatal(err)
				}
				if !v[0].Charged || v[0].Remaining != uint64(5-2*i) || !v[1].Charged || v[1].Remaining != uint64(3-i) {
					t.Fatalf("request %d: %+v, want both charged, remaining %d and %d", i, v, 5-2*i, 3-i)
				}
			}
			v, err := s.Decide(context.Background(), []Hit{minute, second})
			if err != nil {
				t.Fatal(err)
			}
			if v[0].Admitted || v[0].Charged || !v[1].Admitted || v[1].Charged || v[1].Remaining != 1 {
				t.Fatalf("request 3: %+v, want the minute's denied, the second's admitted, neither charged", v)
			}
			s.awaitRefunds()
			if got := keysOf(perSecond); got != second.Key {
				t.Errorf("per-second store holds %q, want only %q", got, second.Key)
			}
			if got := keysOf(main); got != minute.Key {
				t.Errorf("main store holds %q, want only %q", got, minute.Key)
			}
			// The third request's second was charged, then given back: 1
			// unit left of 3 (two charged).
			if v := decideSplit(t, s, hit(a, "u", 3, time.Second, 0)); v.Remaining != 1 {
				t.Errorf("per-second counter after the denied request: %+v, want 1 left", v)
			}
		})
	}
}

func decideSplit(t *testing.T, s *Split, hits ...Hit) Verdict {
	t.Helper()
	v, err := s.Decide(context.Background(), hits)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return v[0]
}

// TestSplitAllOrNothing: a request denied on one store charges nothing on
// the other: what that one charged is given back.
func TestSplitAllOrNothing(t *testing.T) {
	s, _, _ := newTestSplit(t, epoch.Add(100*time.Millisecond))
	second, minute := hit(config.FixedWindow, "u", 1, time.Second, 1), hit(config.FixedWindow, "u", 10, time.Minute, 1)
	if v := decideSplit(t, s, second); !v.Charged {
		t.Fatalf("first: %+v", v)
	}
	v, err := s.Decide(context.Background(), []Hit{second, minute})
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Admitted || !v[1].Admitted || v[1].Charged || v[1].Remaining != 10 {
		t.Fatalf("verdicts %+v, want the second's denied, the minute's admitted, uncharged, 10 left", v)
	}
	s.awaitRefunds()
	minute.Cost = 0
	if v := decideSplit(t, s, minute); v.Remaining != 10 {
		t.Fatalf("minute counter %+v, want 10 left: the denied request's charge given back", v)
	}
	// Recorded costs and refunds stay whatever the request's fate.
	record, back := hit(config.FixedWindow, "r", 10, time.Minute, 3), hit(config.FixedWindow, "b", 10, time.Minute, 0)
	record.Record, back.Refund = true, true
	if _, err := s.Decide(context.Background(), []Hit{second, record, back}); err != nil {
		t.Fatal(err)
	}
	s.awaitRefunds()
	record.Record, record.Cost = false, 0
	if v := decideSplit(t, s, record); v.Remaining != 7 {
		t.Fatalf("recorded cost %+v, want 7 left", v)
	}
}

// TestSplitQuotaAcrossStores: quotas on both stores are the request's
// quotas: the request fits when one of them does.
func TestSplitQuotaAcrossStores(t *testing.T) {
	s, _, _ := newTestSplit(t, epoch.Add(100*time.Millisecond))
	second, minute := hit(config.FixedWindow, "q", 1, time.Second, 1), hit(config.FixedWindow, "q", 5, time.Minute, 1)
	second.Quota, minute.Quota, minute.QuotaGroup = true, true, 1
	decideSplit(t, s, second)
	v, err := s.Decide(context.Background(), []Hit{second, minute})
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Admitted || v[0].Charged || !v[1].Admitted || !v[1].Charged {
		t.Fatalf("verdicts %+v, want the second's denied and uncharged, the minute's admitted and charged", v)
	}
	minute.Cost = 0
	if v := decideSplit(t, s, minute); v.Remaining != 4 {
		t.Fatalf("minute quota %+v, want 4 left", v)
	}
	// Neither fits: nothing charged.
	exhausted := hit(config.FixedWindow, "q2", 1, time.Minute, 2)
	exhausted.Quota, exhausted.QuotaGroup = true, 1
	v, _ = s.Decide(context.Background(), []Hit{second, exhausted, hit(config.FixedWindow, "e", 5, time.Minute, 1)})
	s.awaitRefunds()
	if v[2].Charged || decideSplit(t, s, hit(config.FixedWindow, "e", 5, time.Minute, 0)).Remaining != 5 {
		t.Fatalf("verdicts %+v: an enforced hit was charged though no quota hit fits", v)
	}
}

// TestSplitQuotaGroups: TestQuotaGroups's requests with a counter of each
// quota on the per-second store: a quota over on one store charges nothing
// on the other either.
func TestSplitQuotaGroups(t *testing.T) {
	perSecond := map[string]bool{"a1": true, "b": true}
	for _, a := range algorithms {
		for _, c := range quotaCases {
			t.Run(a.String()+"/"+c.name, func(t *testing.T) {
				s, _, _ := newTestSplit(t, epoch.Add(100*time.Millisecond))
				checkQuotaCase(t, s, s.awaitRefunds, c, func(key string, limit uint32, cost uint64) Hit {
					if perSecond[key] {
						return hit(a, key, limit, time.Second, cost)
					}
					return hit(a, key, limit, time.Minute, cost)
				})
			})
		}
	}
}

// TestSplitStoreDown: a store that is down answers its own hits by their
// failure modes; the other store's are real, and given back when a failure
// mode denies the request.
func TestSplitStoreDown(t *testing.T) {
	s, main, _ := newTestSplit(t, epoch.Add(100*time.Millisecond))
	main.m.Close()
	second := hit(config.FixedWindow, "d", 5, time.Second, 1)
	minute := hit(config.FixedWindow, "d", 5, time.Minute, 1)
	v, err := s.Decide(context.Background(), []Hit{second, minute})
	if !errors.Is(err, ErrStore) {
		t.Fatalf("error %v, want ErrStore", err)
	}
	if !v[0].Charged || v[0].FailureVerdict || !v[1].FailureVerdict || !v[1].Admitted {
		t.Fatalf("verdicts %+v, want the second's charged, the minute's an allowing failure verdict", v)
	}
	minute.FailureMode = config.FailureDeny
	v, err = s.Decide(context.Background(), []Hit{second, minute})
	if !errors.Is(err, ErrStore) || v[0].Charged || v[1].Admitted || !v[1].FailureVerdict {
		t.Fatalf("verdicts %+v, error %v: want the minute's denied by its failure mode, the second's given back", v, err)
	}
	s.awaitRefunds()
	second.Cost = 0
	if v := decideSplit(t, s, second); v.Remaining != 4 {
		t.Fatalf("per-second counter %+v, want 4 left (one charged, one given back)", v)
	}
}

// TestSplitResetAndPrepare: Reset goes to the counter's store; Prepare
// asks both and names the per-second one when it fails.
func TestSplitResetAndPrepare(t *testing.T) {
	s, main, perSecond := newTestSplit(t, epoch.Add(100*time.Millisecond))
	second, minute := hit(config.FixedWindow, "r", 5, time.Second, 1), hit(config.FixedWindow, "r", 5, time.Minute, 1)
	decideSplit(t, s, second, minute)
	if n, err := s.Reset(context.Background(), second); err != nil || n != 1 || keysOf(perSecond) != "" || keysOf(main) != minute.Key {
		t.Fatalf("reset of the second: %d, %v; stores hold %q and %q", n, err, keysOf(main), keysOf(perSecond))
	}
	if err := s.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	perSecond.m.Close()
	if err := s.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "per-second store") {
		t.Fatalf("Prepare with the per-second store down: %v", err)
	}
}

// TestSplitWithoutPerSecond sends everything to the main limiter.
func TestSplitWithoutPerSecond(t *testing.T) {
	l, main := newTestLimiter(t, epoch.Add(100*time.Millisecond))
	s := NewSplit(l, nil)
	second := hit(config.FixedWindow, "n", 5, time.Second, 1)
	decideSplit(t, s, second, hit(config.FixedWindow, "n", 5, time.Minute, 1))
	if len(main.m.Keys()) != 2 {
		t.Fatalf("main store holds %q, want both counters", keysOf(main))
	}
	if _, err := s.Reset(context.Background(), second); err != nil {
		t.Fatal(err)
	}
}

// awaitRefunds waits for the give-backs both limiters have in flight.
func (s *Split) awaitRefunds() {
	s.main.refunds.Wait()
	s.perSecond.refunds.Wait()
}

// TestSplitGivesBackOnlyItsOwnCharge: a request whose per-second part was
// denied after other requests charged the same counter gives back its own
// charge and nothing else: the log its own members (not the newest), GCRA
// only the part of its time still ahead (not what refilled since, which
// others have spent). The later requests are decided directly on the main
// limiter, as if they had landed while the per-second store was slow.
func TestSplitGivesBackOnlyItsOwnCharge(t *testing.T) {
	for _, tc := range []struct {
		alg config.Algorithm
		// after the give-back, probeAfter later, what fits: at most fits units
		fits       uint64
		probeAfter time.Duration
	}{
		// The first request's 5 members at 0 are gone; the other's 5 at 1 s
		// stay: a window after the first's, 5 of 10 fit (10 had the give-back
		// taken the newest members, the other's).
		{alg: config.SlidingWindowLog, fits: 5, probeAfter: 9500 * time.Millisecond},
		{alg: config.FixedWindow, fits: 5},
		{alg: config.SlidingWindowCounter, fits: 5},
		// A bucket of 10 refilling one unit a second: the first took 5 at 0,
		// the other 6 at 1 s (what was left and the unit refilled), then the
		// first's give-back at 1 s: 4 of its 5 units' time is still ahead.
		{alg: config.GCRA, fits: 4},
	} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			s, main, perSecond := newTestSplit(t, epoch.Add(100*time.Millisecond))
			counter := hit(tc.alg, "own", 10, 10*time.Second, 5)
			gate := hit(tc.alg, "own", 1, time.Second, 1)
			if v := decideSplit(t, s, gate); !v.Charged {
				t.Fatalf("the per-second counter's one unit: %+v", v)
			}
			v, err := s.main.Decide(context.Background(), []Hit{counter})
			if err != nil || !v[0].Charged {
				t.Fatalf("the first request's main part: %+v, %v", v, err)
			}
			main.add(time.Second)
			perSecond.add(time.Second / 2) // the same per-second window: its unit is still spent
			other := counter
			if tc.alg == config.GCRA {
				other.Cost = 6
			}
			if v, err := s.main.Decide(context.Background(), []Hit{other}); err != nil || !v[0].Charged {
				t.Fatalf("the other request: %+v, %v", v, err)
			}
			// The per-second part is denied now: the main part goes back.
			denied, err := s.perSecond.Decide(context.Background(), []Hit{gate})
			if err != nil || denied[0].Admitted {
				t.Fatalf("the first request's per-second part: %+v, %v", denied, err)
			}
			hits, verdicts := []Hit{counter, gate}, []Verdict{v[0], denied[0]}
			s.main.undo(context.Background(), "test", hits, []int{0}, verdicts, takenBack(hits, verdicts))
			s.awaitRefunds()
			main.add(tc.probeAfter)
			probe := counter
			probe.Cost = tc.fits + 1
			if v := decideSplit(t, s, probe); v.Admitted {
				t.Fatalf("%d units fit after the give-back, want at most %d: %+v", probe.Cost, tc.fits, v)
			}
			probe.Cost = tc.fits
			if v := decideSplit(t, s, probe); !v.Admitted {
				t.Fatalf("%d units do not fit after the give-back: %+v", tc.fits, v)
			}
		})
	}
}

// TestGiveBackAfterAReset: the give-back of a request's part (Split's, or
// the Cluster refund's), by its token, when a Reset came between the
// charge and the give-back, takes nothing: the Reset took the charge, and
// the count holds only what others charged since (make sim seed 52091: a
// sliding counter's estimate 8.008 of 8, the give-back of a part charged
// before a Reset taken off a charge after it). A charge made after a Reset
// still goes back whole. The reference's keys, whose count has no room for
// a generation, name the key's life by its expiry (make sim seed 8040 of
// reference_fixed_window: 41 of 40).
func TestGiveBackAfterAReset(t *testing.T) {
	for _, a := range []config.Algorithm{config.FixedWindow, config.SlidingWindowCounter, config.GCRA, config.SlidingWindowLog, config.ReferenceFixedWindow} {
		for _, tc := range []struct {
			name           string
			between, slice bool
		}{
			{name: "a Reset before the charge"},
			{name: "a Reset between the charge and its give-back", between: true},
			// A slice (an RLQS lease, say) goes back by its record, which
			// a Reset deletes: the generation is not its to name.
			{name: "a Reset before a slice's charge", slice: true},
		} {
			between := tc.between
			t.Run(a.String()+"/"+tc.name, func(t *testing.T) {
				l, _ := newTestLimiter(t, epoch)
				h := hit(a, "gen", 10, 10*time.Second, 5)
				h.part = true // as Split's (the log names a part's members by a nonce)
				if tc.slice {
					h.Ahead = time.Second
				}
				plain := h
				plain.Ahead = 0 // a log keeps a live slice's members through a Reset
				if !between {
					decide1(t, l, plain)
					reset1(t, l, h)
				}
				first := decide1(t, l, h)
				if between {
					reset1(t, l, h)
				}
				if other := decide1(t, l, plain); !first.Charged || !other.Charged {
					t.Fatalf("the two charges: %+v, %+v", first, other)
				}
				l.undo(context.Background(), "test", []Hit{h}, []int{0}, []Verdict{first}, []bool{true})
				l.refunds.Wait()
				check := plain
				check.Cost = 0
				if v := decide1(t, l, check); v.Remaining != 5 {
					t.Fatalf("remaining %d after the give-back, want 5: the other charge's 5 held, the first's gone", v.Remaining)
				}
			})
		}
	}
}

// TestSplitGivesBackHitsOnOneKeyOnce: two hits on one key are one charge
// (Decide merges them); when the other store denies the request, the whole
// charge goes back. Given back hit by hit, under the one token, the log's
// second hit took back the first's first member again, and left its own.
func TestSplitGivesBackHitsOnOneKeyOnce(t *testing.T) {
	for _, alg := range []config.Algorithm{config.SlidingWindowLog, config.FixedWindow, config.SlidingWindowCounter, config.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			s, _, _ := newTestSplit(t, epoch.Add(100*time.Millisecond))
			gate := hit(alg, "gate", 1, time.Second, 1)
			if v := decideSplit(t, s, gate); !v.Charged {
				t.Fatalf("the per-second counter's one unit: %+v", v)
			}
			a, b := hit(alg, "own", 10, 10*time.Second, 2), hit(alg, "own", 10, 10*time.Second, 3)
			v, err := s.Decide(context.Background(), []Hit{a, b, gate})
			if err != nil || v[0].Admitted && v[2].Admitted {
				t.Fatalf("the request: %+v, %v", v, err)
			}
			s.awaitRefunds()
			probe := hit(alg, "own", 10, 10*time.Second, 10)
			if v := decideSplit(t, s, probe); !v.Admitted {
				t.Fatalf("the limit does not fit after the give-back: %+v", v)
			}
		})
	}
}

// TestSplitGivesBackALogSlice: a log's slice (a charge with Ahead: an RLQS
// lease of a rule with a per-second limit beside) whose request the
// per-second store denies is given back by its members' name, "A<score>":
// by its bare score, the give-back named nothing, and the slice stayed
// counted a window and its period, given back by no one.
func TestSplitGivesBackALogSlice(t *testing.T) {
	s, main, _ := newTestSplit(t, epoch)
	minute := hit(config.SlidingWindowLog, "u", 100, time.Minute, 5)
	minute.Ahead = 12 * time.Second
	full := hit(config.SlidingWindowLog, "u", 1, time.Second, 1)
	decideSplit(t, s, full) // the per-second counter is full
	v, err := s.Decide(context.Background(), []Hit{minute, full})
	if err != nil || v[1].Admitted {
		t.Fatalf("verdicts %+v, %v: want the per-second part denied", v, err)
	}
	s.awaitRefunds()
	if members, _ := main.m.ZMembers(minute.Key); len(members) != 0 {
		t.Errorf("the denied request's slice is still on the main log: %q", members)
	}
}
