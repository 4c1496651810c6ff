package service

import (
	"fmt"
	"slices"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/metrics"
)

// From a request's descriptors to the limits that apply to them, and the
// hits the limiter counts for them.

// limit is what applies to one descriptor of a request.
type limit struct {
	rule            *config.Rule // nil for an override in a domain without a matching rule
	name            string
	requestsPerUnit uint32
	unit            config.Unit
	multiplier      uint32
	zone            *time.Location // the rule's time_zone: nil is UTC
	algorithm       config.Algorithm
	burst           uint32 // GCRA's bucket; 0: requestsPerUnit
	failureMode     config.FailureMode
	recordCosts     config.CostRecording
	leases          bool // leases: true: an acquisition is a lease
	settling        bool // the descriptor settles a lease: its last entry is the id (LeaseKey)
	shadow          bool
	quota           bool // quota_mode: denies only with every quota descriptor of the request
	unlimited       bool
	overridden      bool             // its numbers come from the descriptor's limit override
	replaces        []string         // names of the limits this one drops
	metadata        *structpb.Struct // for dynamic_metadata; shared, never modified
	hit             int              // index into the request's hits, or -1
	// also holds the descriptor's other limits (rate_limits), each with a
	// counter and a hit of its own; the answer shows the tightest.
	also []*limit
}

// resolve finds the limit for a descriptor: the matching rule, replaced in
// its numbers by the descriptor's own limit override when it has one (as
// envoyproxy/ratelimit does, an override applies in any known domain, and
// keeps none of the rule's name, replaces, shadow or quota mode; it keeps
// this service's extensions: algorithm, failure mode, shared counters). It
// returns nil when no limit applies, as for a descriptor without entries,
// which the reference answers OK too.
func resolve(cfg *config.Config, domain string, d *rlcommon.RateLimitDescriptor) (*limit, error) {
	if len(d.Entries) == 0 {
		return nil, nil
	}
	rule := config.Match(cfg, domain, d.Entries)
	override := d.Limit
	if rule == nil && (override == nil || !cfg.HasDomain(domain)) {
		return nil, nil
	}
	var l *limit
	if rule != nil {
		l = ruleLimit(rule)
	} else {
		l = &limit{hit: -1}
		defaults := cfg.Defaults()
		l.algorithm, l.failureMode, l.recordCosts = defaults.Algorithm, defaults.FailureMode, defaults.RecordCosts
	}
	if override == nil {
		if all := rule.Limits(); len(all) > 1 {
			l.also = make([]*limit, len(all)-1)
			for i, r := range all[1:] {
				l.also[i] = ruleLimit(r)
			}
		}
		return l, nil
	}
	// An override replaces the rule's numbers: one limit, the override's.
	unit, ok := unitFromOverride(override.Unit)
	if !ok {
		return nil, fmt.Errorf("limit override has unit %v", override.Unit)
	}
	l.requestsPerUnit, l.unit, l.multiplier = override.RequestsPerUnit, unit, 1
	l.burst = 0 // a GCRA bucket sized for the rule's rate: the override's full window instead
	if m := override.UnitMultiplier; m != nil {
		// Compared before multiplying, which could overflow.
		if m.Value == 0 || time.Duration(m.Value) > config.MaxWindow/unit.Duration() {
			return nil, fmt.Errorf("limit override unit_multiplier %d: the window must be 1 unit to %v", m.Value, config.MaxWindow)
		}
		l.multiplier = m.Value
	}
	if err := l.algorithm.CheckLimit(l.requestsPerUnit); err != nil {
		return nil, fmt.Errorf("limit override of %w", err)
	}
	// As the reference, an override is a limit of its own: not the rule's
	// name, replaces, quota_mode, metadata, shadow_mode or unlimited.
	l.name, l.replaces, l.quota, l.metadata = "", nil, false, nil
	l.shadow, l.unlimited = false, false
	// Nor leases: a lease id names the rule's counter, which an override
	// does not count on; its descriptor is charged as any other.
	l.leases = false
	l.overridden = true
	return l, nil
}

// ruleLimit is the limit a rule sets.
func ruleLimit(rule *config.Rule) *limit {
	return &limit{
		rule:            rule,
		name:            rule.Name,
		requestsPerUnit: rule.RequestsPerUnit,
		unit:            rule.Unit,
		multiplier:      rule.UnitMultiplier,
		zone:            rule.Zone,
		algorithm:       rule.Algorithm,
		burst:           rule.Burst,
		failureMode:     rule.FailureMode,
		recordCosts:     rule.RecordCosts,
		leases:          rule.Leases,
		shadow:          rule.ShadowMode,
		quota:           rule.QuotaMode,
		unlimited:       rule.Unlimited,
		replaces:        rule.Replaces,
		metadata:        rule.Metadata,
		hit:             -1,
	}
}

func (l *limit) window() time.Duration {
	return l.unit.Duration() * time.Duration(l.multiplier)
}

// calendar is the calendar the limit's windows follow, an override's
// included: a monthly override of a fixed_window rule counts calendar
// months too, in the rule's zone.
func (l *limit) calendar() config.Calendar {
	return config.CalendarOf(l.algorithm, l.unit, l.multiplier, l.zone)
}

// dropReplaced removes the limits that another matched limit replaces
// (rate_limit.replaces), as envoyproxy/ratelimit does. Of a descriptor with
// several limits, only those replaced go. An unlimited limit never goes: the
// reference sets those aside before replaces apply, so it still answers as
// unlimited, and is no quota descriptor.
func dropReplaced(limits []*limit) {
	var replaced map[string]bool
	mark := func(l *limit) {
		if len(l.replaces) == 0 {
			return
		}
		if replaced == nil {
			replaced = map[string]bool{}
		}
		for _, name := range l.replaces {
			replaced[name] = true
		}
	}
	for _, l := range limits {
		if l == nil {
			continue
		}
		mark(l)
		for _, a := range l.also {
			mark(a)
		}
	}
	if replaced == nil {
		return
	}
	gone := func(l *limit) bool { return l.name != "" && !l.unlimited && replaced[l.name] }
	for i, l := range limits {
		if l == nil {
			continue
		}
		l.also = slices.DeleteFunc(l.also, gone)
		if gone(l) {
			limits[i] = nil
			if len(l.also) > 0 {
				limits[i], l.also[0].also = l.also[0], l.also[1:]
			}
		}
	}
}

// costHit is the limiter's hit for descriptor d of a request whose cost is
// requestCost. A descriptor's own hits_addend wins; with is_negative_hits the
// cost is given back. Whether a cost that does not fit is recorded anyway
// (a cost reported after it was spent) is the limit's record_costs.
func (l *limit) costHit(kb *limiter.KeyBuilder, domain string, d *rlcommon.RateLimitDescriptor, requestCost uint64) limiter.Hit {
	cost, fromDescriptor := requestCost, false
	if d.HitsAddend != nil {
		cost, fromDescriptor = d.HitsAddend.Value, true
	}
	entries := d.Entries
	if l.settling {
		entries = entries[:len(entries)-1] // the lease id is no part of the counter's name
	}
	if l.requestsPerUnit == 0 {
		// A zero limit admits nothing, not even a check of cost 0, and
		// keeps no count: the limiter denies a cost above the limit
		// without a store call, and charges no other descriptor of the
		// request.
		return l.storeHit(kb, domain, entries, max(cost, 1))
	}
	h := l.storeHit(kb, domain, entries, cost)
	if l.leases {
		l.leaseHit(&h, d)
		return h
	}
	h.Refund = d.IsNegativeHits
	// A check (cost 0) records nothing: it stays a plain hit, which the deny
	// cache may answer.
	h.Record = !h.Refund && cost > 0 && l.recordCosts.Records(fromDescriptor)
	return h
}

// storeHit is the hit for a descriptor under this limit.
func (l *limit) storeHit(kb *limiter.KeyBuilder, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, cost uint64) limiter.Hit {
	return limiter.Hit{
		Key:       storeKey(kb, domain, entries, l),
		Algorithm: l.algorithm,
		Limit:     l.requestsPerUnit,
		Window:    l.window(),
		Calendar:  l.calendar(),
		Cost:      cost,
		Burst:     l.burst,
		Shadow:    l.shadow,
		// A quota hit's denial alone does not deny its request: the limiter
		// charges the request when one of its quotas (QuotaGroup, a
		// descriptor's limits) fits whole.
		Quota:       l.quota,
		FailureMode: l.failureMode,
	}
}

// route is how the layers over the limiter route the limit's hits: a
// global rule through the regions (Global), a concurrency rule's seats off
// the slices (a slice would hold seats no request uses), as the rule's
// hot_key_slices says.
func (l *limit) route() decision.Route {
	if l.rule == nil {
		return decision.Route{NoSlices: l.leases}
	}
	return decision.Route{Global: l.rule.Global, NoSlices: l.leases || l.rule.NoSlices}
}

// storeKey names the counter of a descriptor. Entries matched by a
// share_threshold wildcard contribute the pattern, so that all their values
// share one counter. An algorithm with the reference's keys gets them as
// the reference writes them, an override's with every value as it is.
func storeKey(kb *limiter.KeyBuilder, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, l *limit) string {
	shared := l.rule != nil
	if l.algorithm.ReferenceKeys() {
		kb.ResetReference(domain)
		shared = shared && !l.overridden
	} else {
		kb.Reset(domain)
	}
	for i, e := range entries {
		if shared && i < len(l.rule.Levels) && l.rule.Levels[i].ShareThreshold {
			kb.AddShared(e.Key, l.rule.Levels[i].Value)
			continue
		}
		kb.Add(e.Key, e.Value)
	}
	if c := l.calendar(); !c.IsZero() {
		return kb.CalendarKey(l.algorithm, c)
	}
	return kb.Key(l.algorithm, l.window())
}

// label names the limit in metrics: the rule's name, else its path; both
// come from the config, so the label set stays bounded.
func (l *limit) label() string {
	switch {
	case l.rule == nil:
		return "override"
	case l.rule.Name != "":
		return l.rule.Name
	}
	return l.rule.Path()
}

// ruleLimits are the limits cfg's rules set, named as decisions' metrics
// name them (label).
func ruleLimits(cfg *config.Config) []metrics.RuleLimit {
	var out []metrics.RuleLimit
	for _, r := range cfg.Rules() {
		for _, lr := range r.Limits() {
			if lr.Unlimited {
				continue
			}
			out = append(out, metrics.RuleLimit{Domain: lr.Domain, Rule: ruleLimit(lr).label(),
				Algorithm: lr.Algorithm.String(), Window: lr.Window(), Requests: lr.RequestsPerUnit})
		}
	}
	return out
}

// String names the limit in logs.
func (l *limit) String() string {
	if l.rule != nil {
		return l.rule.String()
	}
	return "limit override"
}
