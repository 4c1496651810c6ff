package config

// Checking a document: its raw content, decoded by parse.go, validated
// descriptor by descriptor and limit by limit into the domain's tree and
// its Rules (a descriptor's metadata in metadata.go).

import (
	"fmt"
	"strings"
	"time"
)

// parser validates and indexes one document's raw content.
type parser struct {
	file     string
	defaults Defaults
	domain   *domain
	warnings *[]string // the builder's
}

func (p *parser) errorf(line int, format string, args ...any) error {
	return errorAt(p.file, line, format, args...)
}

// warnf records something the reference accepts and so do we, but that is
// most likely a mistake.
func (p *parser) warnf(line int, format string, args ...any) {
	*p.warnings = append(*p.warnings, fmt.Sprintf("%s:%d: %s", p.file, line, fmt.Sprintf(format, args...)))
}

// required checks a string field that must be present and non-empty; line is
// reported when it is absent.
func (p *parser) required(s scalar[string], what string, line int) error {
	switch {
	case !s.Set:
		return p.errorf(line, "%s is missing", what)
	case s.V == "":
		return p.errorf(s.Line, "%s is empty", what)
	}
	return nil
}

// site is where something is defined, for duplicate messages.
type site struct {
	file string
	line int
}

// descriptors validates one level of descriptors and adds them to lvl. path
// leads to the level; line is its parent's, reported for a descriptor without
// a line of its own. seen holds the (key, value) pairs already at this level:
// the domain's top level carries them over from the files merged before.
func (p *parser) descriptors(raws []rawDescriptor, lvl level, path []Level, line int, seen map[[2]string]site) error {
	for i := range raws {
		rd := &raws[i]
		if err := p.required(rd.Key, "descriptor key", rd.Value.lineOr(line)); err != nil {
			return err
		}
		l := Level{
			Key:            rd.Key.V,
			Value:          rd.Value.V,
			Wildcard:       strings.Contains(rd.Value.V, "*"),
			ShareThreshold: rd.ShareThreshold.V,
			ValueToMetric:  rd.ValueToMetric.V,
		}
		if l.ShareThreshold && !l.Wildcard {
			return p.errorf(rd.ShareThreshold.Line, "share_threshold needs a wildcard value (with '*'), got %q", l.Value)
		}
		id := [2]string{l.Key, l.Value}
		if at, dup := seen[id]; dup {
			first := fmt.Sprintf("line %d", at.line)
			if at.file != p.file {
				first = fmt.Sprintf("%s:%d", at.file, at.line)
			}
			if l.Value == "" {
				return p.errorf(rd.Key.Line, "duplicate descriptor key %q (first at %s)", l.Key, first)
			}
			return p.errorf(rd.Key.Line, "duplicate descriptor key %q value %q (first at %s)", l.Key, l.Value, first)
		}
		seen[id] = site{p.file, rd.Key.Line}

		metadata, err := p.metadata(&rd.Metadata)
		if err != nil {
			return err
		}
		n := &node{}
		lvl.add(l, n)
		here := append(path[:len(path):len(path)], l) // a copy: each rule owns its Levels
		if rd.RateLimit != nil || len(rd.RateLimits) > 0 {
			rules, err := p.rules(rd, here)
			if err != nil {
				return err
			}
			for _, r := range rules {
				r.Metadata = metadata
			}
			n.rule = rules[0]
			p.domain.rules = append(p.domain.rules, rules...)
		} else if metadata != nil {
			// The reference ignores it too: only a matched rate_limit's
			// metadata reaches an answer.
			p.warnf(rd.Metadata.Line, "metadata on a descriptor without rate_limit has no effect")
		}
		if len(rd.Descriptors) > 0 {
			n.children = level{}
			if err := p.descriptors(rd.Descriptors, n.children, here, rd.Key.Line, make(map[[2]string]site, len(rd.Descriptors))); err != nil {
				return err
			}
		}
	}
	return nil
}

// rules validates the limits of rd, a descriptor at the end of levels: its
// rate_limit, then each of its rate_limits. Several limits each have their
// own counter, so no two may share an algorithm and a window, nor two be
// keyed as the reference keys, and none may be unlimited.
func (p *parser) rules(rd *rawDescriptor, levels []Level) ([]*Rule, error) {
	var raws []*rawRateLimit
	if rd.RateLimit != nil {
		raws = append(raws, rd.RateLimit)
	}
	for i := range rd.RateLimits {
		raws = append(raws, &rd.RateLimits[i])
	}
	rules := make([]*Rule, len(raws))
	for i, rl := range raws {
		r, err := p.rule(rd, rl, levels)
		if err != nil {
			return nil, err
		}
		rules[i] = r
		if len(raws) == 1 {
			break
		}
		line := firstLine(rl, rd.Key.Line)
		if r.Unlimited {
			return nil, p.errorf(line, "a descriptor with several limits cannot have an unlimited one")
		}
		if r.Leases {
			// One lease id per descriptor in an answer, one settlement per
			// stream-done descriptor: the lease is the descriptor's.
			return nil, p.errorf(line, "a descriptor with several limits cannot have one with leases")
		}
		for _, prev := range rules[:i] {
			if prev.Algorithm.ReferenceKeys() && r.Algorithm.ReferenceKeys() {
				// Its keys name no window length: both would count at one key
				// whenever their windows start together.
				return nil, p.errorf(line, "a descriptor has one limit of algorithm %s (envoyproxy/ratelimit's keys, "+
					"one per descriptor); give the others another algorithm", r.Algorithm)
			}
			// A calendar window's key names its calendar, not its length
			// (12 months and a year share one).
			if prev.Algorithm == r.Algorithm && prev.Calendar() == r.Calendar() &&
				(!prev.Calendar().IsZero() || prev.Window() == r.Window()) {
				return nil, p.errorf(line, "two limits of one descriptor with algorithm %s and a window of %v would share one counter", r.Algorithm, r.Window())
			}
		}
		// Each limit is a rule of its own in metrics and /rlconfig.
		r.path += fmt.Sprintf(" [%d]", i)
	}
	for _, r := range rules {
		r.limits = rules
	}
	return rules, nil
}

// firstLine returns the line of rl's first field, or line when it has none.
func firstLine(rl *rawRateLimit, line int) int {
	first := 0
	for _, l := range []int{rl.Unit.Line, rl.RequestsPerUnit.Line, rl.Unlimited.Line, rl.Name.Line, rl.Algorithm.Line,
		rl.UnitMultiplier.Line, rl.FailureMode.Line, rl.RecordCosts.Line, rl.RefundOrder.Line, rl.HotKeySlices.Line,
		rl.TimeZone.Line} {
		if l > 0 && (first == 0 || l < first) {
			first = l
		}
	}
	if first == 0 {
		return line
	}
	return first
}

// rule validates rl, a limit of rd, a descriptor at the end of levels.
func (p *parser) rule(rd *rawDescriptor, rl *rawRateLimit, levels []Level) (*Rule, error) {
	line := rd.Key.Line // reported for an absent field
	r := &Rule{
		Domain:          p.domain.name,
		Levels:          levels,
		Name:            rl.Name.V,
		RequestsPerUnit: rl.RequestsPerUnit.V,
		UnitMultiplier:  1,
		Algorithm:       p.defaults.Algorithm,
		FailureMode:     p.defaults.FailureMode,
		RecordCosts:     p.defaults.RecordCosts,
		Unlimited:       rl.Unlimited.V,
		ShadowMode:      rd.ShadowMode.V,
		QuotaMode:       rd.QuotaMode.V,
		DetailedMetric:  rd.DetailedMetric.V,
		ValueToMetric:   rd.ValueToMetric.V,
		Source:          fmt.Sprintf("%s:%d", p.file, line),
		path:            rulePath(levels),
		statKey:         statKey(p.domain.name, levels),
	}
	for _, rp := range rl.Replaces {
		switch rp.Name.V {
		case "":
			return nil, p.errorf(rp.Name.lineOr(line), "replaces entry has an empty name")
		case r.Name:
			return nil, p.errorf(rp.Name.Line, "replaces names this rule itself (%q)", r.Name)
		}
		r.Replaces = append(r.Replaces, rp.Name.V)
		r.replacesAt = append(r.replacesAt, fmt.Sprintf("%s:%d", p.file, rp.Name.Line))
	}
	if r.Unlimited {
		if err := p.unlimited(rl); err != nil {
			return nil, err
		}
		// The reference ignores requests_per_unit beside unlimited: true.
		r.RequestsPerUnit = 0
		return r, nil
	}

	if !rl.Unit.Set {
		return nil, p.errorf(line, "rate_limit unit is missing")
	}
	var err error
	if r.Unit, err = ParseUnit(rl.Unit.V); err != nil {
		return nil, p.errorf(rl.Unit.Line, "%v", err)
	}
	if !rl.RequestsPerUnit.Set {
		// The reference reads a missing one as 0, which denies every
		// request: that must be written, not forgotten.
		return nil, p.errorf(line, "rate_limit requests_per_unit is missing (0 denies every request, unlimited: true admits all)")
	}
	if rl.UnitMultiplier.Set {
		if r.UnitMultiplier = rl.UnitMultiplier.V; r.UnitMultiplier == 0 {
			return nil, p.errorf(rl.UnitMultiplier.Line, "unit_multiplier must be at least 1")
		}
		if time.Duration(r.UnitMultiplier) > MaxWindow/r.Unit.Duration() {
			return nil, p.errorf(rl.UnitMultiplier.Line, "unit_multiplier %d makes the window longer than %d years",
				r.UnitMultiplier, MaxWindow/(365*24*time.Hour))
		}
	}
	if rl.Algorithm.Set {
		if r.Algorithm, err = ParseAlgorithm(rl.Algorithm.V); err != nil {
			return nil, p.errorf(rl.Algorithm.Line, "%v", err)
		}
	}
	if rl.FailureMode.Set {
		if r.FailureMode, err = ParseFailureMode(rl.FailureMode.V); err != nil {
			return nil, p.errorf(rl.FailureMode.Line, "%v", err)
		}
	}
	if rl.RecordCosts.Set {
		if r.RecordCosts, err = ParseCostRecording(rl.RecordCosts.V); err != nil {
			return nil, p.errorf(rl.RecordCosts.Line, "%v", err)
		}
	}
	if err := p.burst(r, rl); err != nil {
		return nil, err
	}
	if err := p.refundOrder(rl); err != nil {
		return nil, err
	}
	if err := p.timeZone(r, rl); err != nil {
		return nil, err
	}
	if err := p.leases(r, rl); err != nil {
		return nil, err
	}
	r.NoSlices = rl.HotKeySlices.Set && !rl.HotKeySlices.V
	if err := p.global(r, rl); err != nil {
		return nil, err
	}
	if err := r.Algorithm.CheckLimit(r.RequestsPerUnit); err != nil {
		return nil, p.errorf(rl.RequestsPerUnit.Line, "requests_per_unit %v", err)
	}
	return r, nil
}

// burst sets the bucket size of a token bucket rule (gcra): rate_limit.burst,
// by default requests_per_unit (a full window's worth). Other algorithms
// have no bucket.
func (p *parser) burst(r *Rule, rl *rawRateLimit) error {
	if !r.Algorithm.Bucket() {
		if rl.Burst.Set {
			how := "algorithm is " + r.Algorithm.String()
			if !rl.Algorithm.Set {
				how = "default algorithm is " + r.Algorithm.String() + "; add algorithm: " + bucketNames[0]
			}
			return p.errorf(rl.Burst.Line, "burst applies only to algorithm %s, and this rule's %s", strings.Join(bucketNames, " or "), how)
		}
		return nil
	}
	r.Burst = r.RequestsPerUnit
	if !rl.Burst.Set {
		return nil
	}
	if r.Burst = rl.Burst.V; r.Burst == 0 {
		return p.errorf(rl.Burst.Line, "burst must be greater than 0")
	}
	// The bucket's size in time: the store keeps it, and a charge's refund
	// token, in bounded numbers.
	if float64(r.Burst)*float64(r.Window())/float64(r.RequestsPerUnit) > float64(MaxWindow) {
		return p.errorf(rl.Burst.Line, "burst %d takes more than %d years to refill at %d per %v",
			r.Burst, MaxWindow/(365*24*time.Hour), r.RequestsPerUnit, r.Window())
	}
	return nil
}

// refundOrder reads rate_limit.refund_order: "newest", the only order a
// refund (is_negative_hits) has. "oldest" freed the longest held seat of a
// concurrency limit whose releases name no seat; it is refused: a release
// that reaches the store before its acquisition (a slow batch on one
// instance, the release on another) frees another request's seat, and no
// order of unnamed seats holds the limit then. A lease id names the seat.
func (p *parser) refundOrder(rl *rawRateLimit) error {
	if !rl.RefundOrder.Set {
		return nil
	}
	switch rl.RefundOrder.V {
	case "newest":
		return nil
	case "oldest":
		return p.errorf(rl.RefundOrder.Line, "refund_order: oldest (seats released without naming them) is no longer supported: "+
			"a release that reaches the store before its acquisition frees another request's seat; give the rule "+
			"leases: true and send the lease id back from the stream-done call (a metadata action on "+
			"envoy.filters.http.ratelimit leases.<rule name>, descriptor_key: lease; docs/budgets.md, \"Concurrency limits\")")
	}
	return p.errorf(rl.RefundOrder.Line, "refund_order %q: want newest", rl.RefundOrder.V)
}

// timeZone reads rate_limit.time_zone, the zone whose calendar a fixed
// window of days, weeks, months or years follows. It has no effect
// elsewhere (sliding windows and buckets have no edges, shorter units no
// midnight, the reference's keys no zone), so it is refused there rather
// than ignored.
func (p *parser) timeZone(r *Rule, rl *rawRateLimit) error {
	if !rl.TimeZone.Set {
		return nil
	}
	if r.Algorithm != FixedWindow {
		how := "algorithm is " + r.Algorithm.String()
		if !rl.Algorithm.Set {
			how = "default algorithm is " + r.Algorithm.String() + "; add algorithm: " + FixedWindow.String()
		}
		return p.errorf(rl.TimeZone.Line, "time_zone applies only to algorithm %s (calendar windows), and this rule's %s", FixedWindow, how)
	}
	if r.Unit < Day {
		return p.errorf(rl.TimeZone.Line, "time_zone applies only to units day, week, month and year, and this rule's unit is %s",
			strings.ToLower(r.Unit.String()))
	}
	zone, err := loadZone(rl.TimeZone.V)
	if err != nil {
		return p.errorf(rl.TimeZone.Line, "%v", err)
	}
	r.Zone = zone
	return nil
}

// leases reads rate_limit.leases and lease_ttl: a rule whose acquisitions
// are leases (seats of a concurrency limit, reservations of an estimated
// cost), each answered with an id that its stream-done call settles, and
// that frees itself lease_ttl after it was taken (by default the window;
// docs/budgets.md). Only the log names its units.
func (p *parser) leases(r *Rule, rl *rawRateLimit) error {
	if rl.LeaseTTL.Set && !rl.Leases.V {
		return p.errorf(rl.LeaseTTL.Line, "lease_ttl applies only to a rule with leases: true")
	}
	if !rl.Leases.V {
		return nil
	}
	if r.Algorithm != SlidingWindowLog {
		return p.errorf(rl.Leases.Line, "leases apply only to algorithm %s, and this rule's algorithm is %s",
			SlidingWindowLog, r.Algorithm)
	}
	if rl.RecordCosts.Set {
		return p.errorf(rl.RecordCosts.Line, "record_costs does not apply to a rule with leases: a settlement records its actual cost always")
	}
	r.Leases = true
	if rl.LeaseTTL.Set {
		d, err := time.ParseDuration(rl.LeaseTTL.V)
		if err != nil || d < time.Millisecond || d > MaxWindow {
			return p.errorf(rl.LeaseTTL.Line, "lease_ttl %q: want a duration from 1ms to %d years (e.g. 30s, 5m)",
				rl.LeaseTTL.V, MaxWindow/(365*24*time.Hour))
		}
		if d > r.Window() {
			return p.errorf(rl.LeaseTTL.Line, "lease_ttl %v is longer than the rule's window %v: a lease counts within its window; make the window longer",
				d, r.Window())
		}
		r.LeaseTTL = d
	}
	return nil
}

// global reads rate_limit.global, regional_share and when_cut: a limit
// across regions, decided in each region within an allowance (see
// Global). A region's count is one of the window algorithms' (a bucket's
// is no count), of a window of fixed length, and holds no seats (a lease
// names units a region's allowance does not).
func (p *parser) global(r *Rule, rl *rawRateLimit) error {
	for _, f := range []struct {
		name string
		set  bool
		line int
	}{{"regional_share", rl.RegionalShare.Set, rl.RegionalShare.Line}, {"when_cut", rl.WhenCut.Set, rl.WhenCut.Line}} {
		if f.set && !rl.Global.V {
			return p.errorf(f.line, "%s applies only to a rule with global: true", f.name)
		}
	}
	if !rl.Global.V {
		return nil
	}
	switch {
	case r.Algorithm != SlidingWindowLog && r.Algorithm != SlidingWindowCounter && r.Algorithm != FixedWindow:
		return p.errorf(rl.Global.Line, "global applies only to algorithms %s, %s and %s, and this rule's algorithm is %s",
			SlidingWindowLog, SlidingWindowCounter, FixedWindow, r.Algorithm)
	case !r.Calendar().IsZero():
		return p.errorf(rl.Global.Line, "global does not apply to a calendar window (%s): its length varies", strings.ToLower(r.Unit.String()))
	case r.Leases:
		return p.errorf(rl.Global.Line, "global does not apply to a rule that holds seats (leases)")
	}
	g := &Global{Share: rl.RegionalShare.V, WhenCut: CutShare}
	if !(g.Share >= 0 && g.Share <= 1) {
		return p.errorf(rl.RegionalShare.Line, "regional_share %v: want a fraction of the limit from 0 to 1", rl.RegionalShare.V)
	}
	if rl.WhenCut.Set {
		var err error
		if g.WhenCut, err = ParseCutMode(rl.WhenCut.V); err != nil {
			return p.errorf(rl.WhenCut.Line, "%v", err)
		}
	}
	switch regions := p.defaults.Regions; {
	case regions == 0:
		return p.errorf(rl.Global.Line, "global needs a ledger and this instance's region: --ledger-redis-url (or -cluster-url, -sentinel-url) and --region")
	case g.Share*float64(regions) > 1:
		return p.errorf(rl.RegionalShare.Line, "regional_share %v for each of %d regions is more than the limit", g.Share, regions)
	}
	r.Global = g
	return nil
}

// unlimited refuses the fields that make no sense for an unlimited rule.
// requests_per_unit is not one of them: the reference ignores it there. Nor
// is a unit that names none, "" or UNKNOWN: the RateLimitConfig proto's
// zero value, which the reference accepts beside unlimited.
func (p *parser) unlimited(rl *rawRateLimit) error {
	noUnit := rl.Unit.V == "" || strings.EqualFold(rl.Unit.V, "UNKNOWN")
	for _, f := range []struct {
		name string
		set  bool
		line int
	}{
		{"unit", rl.Unit.Set && !noUnit, rl.Unit.Line},
		{"unit_multiplier", rl.UnitMultiplier.Set, rl.UnitMultiplier.Line},
		{"algorithm", rl.Algorithm.Set, rl.Algorithm.Line},
		{"failure_mode", rl.FailureMode.Set, rl.FailureMode.Line},
		{"record_costs", rl.RecordCosts.Set, rl.RecordCosts.Line},
		{"burst", rl.Burst.Set, rl.Burst.Line},
		{"refund_order", rl.RefundOrder.Set, rl.RefundOrder.Line},
		{"hot_key_slices", rl.HotKeySlices.Set, rl.HotKeySlices.Line},
		{"time_zone", rl.TimeZone.Set, rl.TimeZone.Line},
		{"leases", rl.Leases.Set, rl.Leases.Line},
		{"lease_ttl", rl.LeaseTTL.Set, rl.LeaseTTL.Line},
		{"global", rl.Global.Set, rl.Global.Line},
		{"regional_share", rl.RegionalShare.Set, rl.RegionalShare.Line},
		{"when_cut", rl.WhenCut.Set, rl.WhenCut.Line},
	} {
		if f.set {
			return p.errorf(f.line, "should not specify rate limit %s when unlimited", f.name)
		}
	}
	return nil
}
