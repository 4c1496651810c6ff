package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// ruleHit is a kind of hit for TestRequestRuleTwins: its flags (and quota
// group), whether it fits, and whether its cost exceeds its limit (denied in
// Go, before Redis).
type ruleHit struct {
	name                          string
	shadow, quota, record, refund bool
	group                         uint32
	fits, exceeds                 bool
}

var ruleHits = func() []ruleHit {
	var kinds []ruleHit
	for _, k := range []ruleHit{
		{name: "enforced"}, {name: "shadow", shadow: true}, {name: "quota", quota: true},
		{name: "quota 1", quota: true, group: 1},
		{name: "shadow+quota", shadow: true, quota: true}, {name: "record", record: true},
		{name: "record+quota", record: true, quota: true},
	} {
		fits, full, exceeds := k, k, k
		fits.fits, fits.name = true, k.name+" fits"
		full.name = k.name + " full"
		kinds = append(kinds, fits, full)
		if !k.record {
			exceeds.exceeds, exceeds.name = true, k.name+" cost>limit"
			kinds = append(kinds, exceeds)
		}
	}
	return append(kinds, ruleHit{name: "refund", refund: true, fits: true})
}()

// TestRequestRuleTwins checks the two places that decide whether a request
// is denied against each other: Go's requestRule (outcome.go), which
// Limiter.decide applies to what it denies before Redis and Split and the
// Cluster refund apply to whole requests, and decide.lua's check loop, its
// twin, which decides on Redis whether a request is charged. For every mix
// of up to three kinds of hits (shadow, quota of two groups, record, refund,
// enforced; fitting, on a full counter, or with a cost past the limit), the
// hits that fit are charged exactly when requestRule says the request is not
// denied, and, for a quota hit, its quota not over.
func TestRequestRuleTwins(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	ctx := context.Background()
	const limit = 2
	outcomes := map[bool]int{}
	mix := 0
	try := func(kinds []int) {
		mix++
		var names []string
		hits := make([]Hit, len(kinds))
		var fill []Hit
		for j, k := range kinds {
			rh := ruleHits[k]
			names = append(names, rh.name)
			h := hit(config.FixedWindow, fmt.Sprintf("m%d-%d", mix, j), limit, time.Minute, 1)
			if rh.exceeds {
				h.Cost = limit + 1
			}
			h.Shadow, h.Quota, h.Record, h.Refund, h.QuotaGroup = rh.shadow, rh.quota, rh.record, rh.refund, rh.group
			if !rh.fits && !rh.exceeds {
				f := h
				f.Shadow, f.Quota, f.Record, f.Refund, f.Cost = false, false, false, false, limit
				fill = append(fill, f)
			}
			hits[j] = h
		}
		if len(fill) > 0 {
			if v, err := l.Decide(ctx, fill); err != nil || !v[0].Charged {
				t.Fatalf("%v: filling the full counters: %+v %v", names, v, err)
			}
		}
		verdicts, err := l.Decide(ctx, hits)
		if err != nil {
			t.Fatalf("%v: %v", names, err)
		}
		rule := ruleOf(hits, verdicts)
		denied := rule.denied()
		for j, h := range hits {
			v, rh := verdicts[j], ruleHits[kinds[j]]
			if v.Admitted != (rh.fits && !rh.exceeds) {
				t.Fatalf("%v: hit %d (%s) admitted=%v: the mix is not what it says", names, j, rh.name, v.Admitted)
			}
			var want bool
			switch {
			case h.Refund:
				want = false // given back, never charged
			case h.Record:
				want = true // spent whatever the request's fate
			default:
				want = v.Admitted && !denied && (!h.quota() || !rule.quotaOver(h.QuotaGroup))
			}
			if v.Charged != want {
				t.Errorf("%v: hit %d (%s) charged=%v, want %v: Go's rule says denied=%v (quotas %+v), decide.lua did otherwise",
					names, j, rh.name, v.Charged, want, denied, rule.quotas)
			}
		}
		outcomes[denied]++
	}
	n := len(ruleHits)
	for a := range n {
		try([]int{a})
		for b := a; b < n; b++ {
			try([]int{a, b})
			for c := b; c < n; c++ {
				try([]int{a, b, c})
			}
		}
	}
	if outcomes[true] == 0 || outcomes[false] == 0 {
		t.Fatalf("outcomes %v: the table does not cover both", outcomes)
	}
	t.Logf("%d mixes: %d denied, %d not", mix, outcomes[true], outcomes[false])
}
