package limiter

import (
	"context"
	"testing"
	"time"
)

// TestQuotaHits: a request with quota hits is charged only when every
// ordinary hit fits and at least one quota does; a quota hit that does not
// fit is not charged, and denies nothing on its own.
func TestQuotaHits(t *testing.T) {
	for _, a := range algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l, _ := newTestLimiter(t, epoch.Add(time.Second))
			quota := func(key string, group uint32, limit uint32, cost uint64) Hit {
				h := hit(a, key, limit, time.Minute, cost)
				h.Quota, h.QuotaGroup = true, group
				return h
			}
			ordinary := hit(a, "ordinary", 10, time.Minute, 1)
			full, free := quota("full", 0, 1, 1), quota("free", 1, 10, 1)
			decide1(t, l, full)
			decide(t, l, []Hit{ordinary, full, free}, []bool{true, false, true})       // one quota fits
			decide(t, l, []Hit{ordinary, full}, []bool{false, false})                  // every quota over
			decide(t, l, []Hit{ordinary, quota("big", 2, 1, 2)}, []bool{false, false}) // over without a store call
			spent := hit(a, "spent", 1, time.Minute, 1)
			decide1(t, l, spent)
			decide(t, l, []Hit{spent, free}, []bool{false, false}) // an ordinary hit over
			if got := remainingOf(t, l, ordinary); got != 9 {
				t.Fatalf("ordinary counter has %d left, want 9: only the first request charged it", got)
			}
			if got := remainingOf(t, l, free); got != 9 {
				t.Fatalf("free quota has %d left, want 9", got)
			}
		})
	}
}

// quotaCase is a request for TestQuotaGroups and its twins across slots
// and stores: its hits, then what each is answered and charged. Every
// counter admits 2 a minute.
type quotaCase struct {
	name              string
	hits              []quotaCaseHit
	admitted, charged []bool
}

// quotaCaseHit is a hit of a quotaCase, on the counter named key.
type quotaCaseHit struct {
	key   string
	group int    // its quota; -1 for an ordinary hit
	full  bool   // its counter is spent beforehand
	cost  uint64 // 0 means 1
}

// quotaCases are the quota hits of one group (a descriptor's limits) as
// one quota, on counters of their own; sharedQuotaCases share a counter.
var quotaCases = []quotaCase{
	{"one limit over, another quota fits",
		[]quotaCaseHit{{"o", -1, false, 0}, {"a1", 0, true, 0}, {"a2", 0, false, 0}, {"b", 1, false, 0}},
		[]bool{true, false, true, true}, []bool{true, false, false, true}},
	{"every quota over",
		[]quotaCaseHit{{"o", -1, false, 0}, {"a1", 0, true, 0}, {"a2", 0, false, 0}, {"b", 1, true, 0}},
		[]bool{true, false, true, false}, []bool{false, false, false, false}},
	{"the only quota, one limit over",
		[]quotaCaseHit{{"a1", 0, true, 0}, {"a2", 0, false, 0}},
		[]bool{false, true}, []bool{false, false}},
	{"every limit of a quota fits",
		[]quotaCaseHit{{"a1", 0, false, 0}, {"a2", 0, false, 0}, {"b", 1, true, 0}},
		[]bool{true, true, false}, []bool{true, true, false}},
	{"a cost past a limit, denied before the store",
		[]quotaCaseHit{{"o", -1, false, 0}, {"a1", 0, false, 3}, {"a2", 0, false, 0}, {"b", 1, false, 0}},
		[]bool{true, false, true, true}, []bool{true, false, false, true}},
}

// sharedQuotaCases: two quotas with a counter in common are charged
// together or not at all: one quota, whose common counter is answered
// denied when it is over.
var sharedQuotaCases = []quotaCase{
	{"a counter in common, one quota over",
		[]quotaCaseHit{{"o", -1, false, 0}, {"s", 0, false, 0}, {"a", 0, false, 0}, {"s", 1, false, 0}, {"b", 1, true, 0}, {"c", 2, false, 0}},
		[]bool{true, false, true, false, false, true}, []bool{true, false, false, false, false, true}},
	{"a counter in common, both quotas fit",
		[]quotaCaseHit{{"s", 0, false, 0}, {"a", 0, false, 0}, {"s", 1, false, 0}, {"b", 1, false, 0}},
		[]bool{true, true, true, true}, []bool{true, true, true, true}},
}

// decider is a Limiter or a Split.
type decider interface {
	Decide(ctx context.Context, hits []Hit) ([]Verdict, error)
}

// checkQuotaCase decides c's request on d, its hits made by mk, and checks
// the verdicts, then, once settle has waited for the refunds, that each
// counter holds exactly what its hits were charged.
func checkQuotaCase(t *testing.T, d decider, settle func(), c quotaCase, mk func(key string, limit uint32, cost uint64) Hit) {
	t.Helper()
	ctx := context.Background()
	const limit = 2
	hits := make([]Hit, len(c.hits))
	left := map[string]uint64{} // what each counter must have left
	for i, ch := range c.hits {
		if _, ok := left[ch.key]; !ok {
			left[ch.key] = limit
			if ch.full {
				if v, err := d.Decide(ctx, []Hit{mk(ch.key, limit, limit)}); err != nil || !v[0].Charged {
					t.Fatalf("spending %s: %+v %v", ch.key, v, err)
				}
				left[ch.key] = 0
			}
		}
		hits[i] = mk(ch.key, limit, max(ch.cost, 1))
		if ch.group >= 0 {
			hits[i].Quota, hits[i].QuotaGroup = true, uint32(ch.group)
		}
	}
	verdicts, err := d.Decide(ctx, hits)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range verdicts {
		if v.Admitted != c.admitted[i] || v.Charged != c.charged[i] {
			t.Errorf("hit %d (%s): %+v, want admitted %t, charged %t", i, c.hits[i].key, v, c.admitted[i], c.charged[i])
		}
		if c.charged[i] {
			left[c.hits[i].key] -= hits[i].Cost
		}
	}
	settle()
	for key, want := range left {
		v, err := d.Decide(ctx, []Hit{mk(key, limit, 0)})
		if err != nil {
			t.Fatal(err)
		}
		if v[0].Remaining != want {
			t.Errorf("%s has %d left, want %d", key, v[0].Remaining, want)
		}
	}
}

// TestQuotaGroups: the quota hits of one group (a descriptor's limits)
// are one quota, which fits only when each of them fits and charges none
// of them when one does not; a request with quotas fits when one fits.
func TestQuotaGroups(t *testing.T) {
	for _, a := range algorithms {
		for _, c := range append(quotaCases, sharedQuotaCases...) {
			t.Run(a.String()+"/"+c.name, func(t *testing.T) {
				l, _ := newTestLimiter(t, epoch.Add(time.Second))
				checkQuotaCase(t, l, l.refunds.Wait, c, func(key string, limit uint32, cost uint64) Hit {
					return hit(a, key, limit, time.Minute, cost)
				})
			})
		}
	}
}

// decide decides hits as one request and checks which were charged.
func decide(t *testing.T, l *Limiter, hits []Hit, charged []bool) {
	t.Helper()
	vs, err := l.Decide(context.Background(), hits)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if v.Charged != charged[i] {
			t.Fatalf("hit %d of %d: %+v, want charged %t", i, len(hits), v, charged[i])
		}
	}
}

// remainingOf is what a check of h's counter reports left.
func remainingOf(t *testing.T, l *Limiter, h Hit) uint64 {
	t.Helper()
	h.Cost, h.Quota = 0, false
	v, err := l.Decide(context.Background(), []Hit{h})
	if err != nil {
		t.Fatal(err)
	}
	return v[0].Remaining
}
