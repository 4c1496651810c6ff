package limiter

// Decide's side of a request: its hits become demands, one per counter
// (hits on one Key are merged), and quotas with a demand in common are
// joined into one; slotgroups.go takes the demands to the store.

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Decide decides the hits of one request atomically and returns a verdict
// per hit, in the order of hits: all or nothing by the request's rule
// (outcome.go). Hits on the same Key are one demand on one counter: their
// costs add up against the smallest of their limits, and each gets the
// merged verdict. Two quotas with such a demand in common are one quota:
// when it does not fit, the common demand is answered denied, with the
// longest wait of its quota's denials.
//
// When the store cannot answer, Decide returns an error wrapping ErrStore,
// or ErrOverloaded when the deadline passed before the request was sent,
// with verdicts by each hit's FailureMode (FailureVerdict set); across
// Redis Cluster slots, per slot group. A hit of an unknown Algorithm fails
// the whole request so, before anything is sent, with an error that wraps
// neither.
func (l *Limiter) Decide(ctx context.Context, hits []Hit) ([]Verdict, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return failureVerdicts(hits), ErrClosed
	}
	if err := checkAlgorithms(hits); err != nil {
		return failureVerdicts(hits), fmt.Errorf("decide: %w", err)
	}
	if err := checkLeases(hits); err != nil {
		return failureVerdicts(hits), fmt.Errorf("decide: %w", err)
	}
	if !sharesKeys(hits) {
		return l.decide(ctx, hits) // nearly always: nothing to merge
	}
	merged := make([]Hit, 0, len(hits))
	groupOf := make([]int, len(hits))
	for i, h := range hits {
		// A refund gives back, a charge takes: they are not one demand. A
		// settlement is its own lease's.
		g := slices.IndexFunc(merged, func(m Hit) bool {
			return m.Key == h.Key && m.Refund == h.Refund && m.Settle == "" && h.Settle == ""
		})
		if g < 0 {
			merged = append(merged, h)
			groupOf[i] = len(merged) - 1
			continue
		}
		m := &merged[g]
		m.Cost = saturatingAdd(m.Cost, h.Cost)
		switch {
		case m.Shadow == h.Shadow:
			m.Limit, m.Burst = min(m.Limit, h.Limit), min(m.burst(), h.burst())
			m.Quota = m.Quota && h.Quota // an ordinary limit denies on its own
		case m.Shadow: // an enforced limit applies, never a shadow one
			m.Limit, m.Burst, m.Quota, m.QuotaGroup = h.Limit, h.Burst, h.Quota, h.QuotaGroup
		}
		m.Shadow = m.Shadow && h.Shadow
		m.Record = m.Record || h.Record // a cost already spent is counted
		if h.Lease && !m.Lease {
			// A check beside a lease on one key (a check is never a lease):
			// the demand is the lease's, and its id names the whole charge.
			m.Lease, m.LeaseTTL = true, h.LeaseTTL
		}
		if h.FailureMode == config.FailureDeny {
			m.FailureMode = config.FailureDeny
		}
		groupOf[i] = g
	}
	common := joinQuotas(hits, merged, groupOf)
	decided, err := l.decide(ctx, merged)
	if common != nil {
		denyCommon(merged, decided, common)
	}
	verdicts := make([]Verdict, len(hits))
	for i, g := range groupOf {
		verdicts[i] = decided[g]
	}
	return verdicts, err
}

// joinQuotas makes one quota of the quotas with a demand in common, which
// is charged for both or for neither: each quota hit of merged gets the
// group of the quotas it joined. It returns those demands, by index in
// merged; nil when there are none.
func joinQuotas(hits, merged []Hit, groupOf []int) []int {
	var joined map[uint32]uint32 // a quota to the one it joined
	root := func(q uint32) uint32 {
		for {
			next, ok := joined[q]
			if !ok {
				return q
			}
			q = next
		}
	}
	var common []int
	for i, g := range groupOf {
		m, h := &merged[g], &hits[i]
		if !m.quota() || !h.quota() || m.QuotaGroup == h.QuotaGroup {
			continue
		}
		if a, b := root(m.QuotaGroup), root(h.QuotaGroup); a != b {
			if joined == nil {
				joined = map[uint32]uint32{}
			}
			joined[b] = a
		}
		if !slices.Contains(common, g) {
			common = append(common, g)
		}
	}
	if joined != nil {
		for i := range merged {
			if merged[i].quota() {
				merged[i].QuotaGroup = root(merged[i].QuotaGroup)
			}
		}
	}
	return common
}

// denyCommon answers denied each demand in common of joined quotas
// (joinQuotas) whose quota is over: it was not charged, and every quota
// that has it must say so. Its wait is the longest of the quota's denials:
// the quota fits only when each of them does.
func denyCommon(merged []Hit, decided []Verdict, common []int) {
	r := ruleOf(merged, decided)
	for _, c := range common {
		q := merged[c].QuotaGroup
		if !decided[c].Admitted || !r.quotaOver(q) {
			continue
		}
		var wait time.Duration
		for k := range merged {
			if merged[k].quota() && merged[k].QuotaGroup == q && !decided[k].Admitted {
				wait = max(wait, decided[k].ResetAfter)
			}
		}
		decided[c].Admitted, decided[c].ResetAfter = false, wait
	}
}

// sharesKeys reports whether two hits are one demand on the same counter.
func sharesKeys(hits []Hit) bool {
	for i := range hits {
		for j := i + 1; j < len(hits); j++ {
			if hits[i].Key == hits[j].Key && hits[i].Refund == hits[j].Refund && hits[i].Settle == "" && hits[j].Settle == "" {
				return true
			}
		}
	}
	return false
}

func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
