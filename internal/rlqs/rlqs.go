// Package rlqs leases the token buckets of Envoy's Rate Limit Quota Service
// (RLQS) from the counters ShouldRateLimit decides on (Allocator): each
// Envoy's bucket is its fair share of the limit (fairshare.Assign), and its
// refills until the assignment expires are charged to the counter before a
// unit is used, as a hot key's slice is, so that every reader counts them.
// It knows nothing of gRPC or of Envoy's messages: a report is a number of
// requests one Envoy saw for one bucket, an answer an Assignment.
// docs/rlqs.md says how shares, leases and give-backs hold one limit.
package rlqs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/slidingwindow/ratelimit/internal/fairshare"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Defaults where Options leave a field zero.
const (
	// DefaultReportInterval is how often Envoy reports: every 5 seconds,
	// whatever the filter's reporting_interval says.
	DefaultReportInterval = 5 * time.Second
	// DefaultLease is an assignment's time to live: two reports and a
	// second, so that one lost report does not expire it.
	DefaultLease = 11 * time.Second
)

// AnswerWithin bounds the time from an assignment's share and lease to its
// sending: a report's answer goes by then, with the buckets decided in
// time. Share and lease outlive the assignment's time to live by it, so
// that Envoy's copy never outlives them.
const AnswerWithin = time.Second

// MinReportGap is the least time between two decisions of one bucket of
// one stream: the counts of a client reporting more often go to the next
// decision, costing the store what a report every MinReportGap does.
const MinReportGap = time.Second

// Now is the allocator's clock.
func (a *Allocator) Now() time.Time { return a.now() }

// headroom is how much more than its measured demand an Envoy asks for, so
// that a demand that grows is not denied until the next report.
const headroom = 1.1

// Ledger is where buckets lease from. The service (internal/app) gives it
// the *limiter.Split ShouldRateLimit decides with, so that a bucket leases
// from the counter, on the store, that a descriptor of its entries charges.
type Ledger interface {
	Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error)
	GiveBack(ctx context.Context, returns []limiter.Return) (uint64, error)
	// Numbers runs the shares' calls where the counter's hits go.
	Numbers(ctx context.Context, c limiter.Call) ([]uint64, error)
}

// Options configure an Allocator. A nil *Options means the defaults.
type Options struct {
	// ReportInterval is how often Envoys report (DefaultReportInterval).
	ReportInterval time.Duration
	// Lease is an assignment's time to live, whole seconds (DefaultLease).
	Lease time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Allocator answers Envoys' reports with assignments. It is safe for
// concurrent use; a Bucket is not.
type Allocator struct {
	ledger   Ledger
	interval time.Duration
	lease    time.Duration
	now      func() time.Time
}

// New returns an Allocator leasing from ledger.
func New(ledger Ledger, opts *Options) *Allocator {
	if opts == nil {
		opts = &Options{}
	}
	a := &Allocator{ledger: ledger, interval: opts.ReportInterval, lease: opts.Lease, now: opts.Now}
	if a.interval <= 0 {
		a.interval = DefaultReportInterval
	}
	if a.lease <= 0 {
		a.lease = DefaultLease
	}
	if a.now == nil {
		a.now = time.Now
	}
	return a
}

// Kind says what an Assignment lets through.
type Kind int

const (
	// AllowAll lets every request through (Envoy's blanket rule ALLOW_ALL).
	AllowAll Kind = iota
	// DenyAll denies every request (DENY_ALL).
	DenyAll
	// TokenBucket admits a request per token.
	TokenBucket
)

// Assignment is what one Envoy is told to enforce for one bucket.
type Assignment struct {
	Kind Kind
	// The token bucket: MaxTokens at most, refilled with TokensPerFill
	// every FillInterval (Envoy refills continuously, at that rate).
	MaxTokens, TokensPerFill uint64
	FillInterval             time.Duration
	// TTL is how long the assignment lives unless sent again.
	TTL time.Duration
}

// Limit is the counter a bucket leases from: the hits of its rule's
// limits (Cost unset), the first the one whose rate the buckets share.
type Limit struct {
	Hits []limiter.Hit
	// ShareKey names the shares of the first hit's counter.
	ShareKey string
}

// Bucket is one Envoy's lease on one limit, owned by the stream reporting it.
type Bucket struct {
	// Member names the Envoy among the shares: its stream, unique.
	Member string

	held       Assignment       // as last sent
	leaseEnd   time.Time        // until when the held bucket's refills are leased
	charges    []leaseCharge    // the held bucket's leases whose refills are not all made, oldest first
	carry      float64          // units leased beyond the exact amount (a credit)
	lastReport time.Time        // zero before the first report
	pending    uint64           // requests of reports too close together to measure
	demand     float64          // units per window, as last measured; < 0 unknown
	others     uint64           // units on the counter that are not the fleet's, at the last lease
	measured   bool             // others was read off the counter
	shrunk     bool             // the assignment made holds less than the one before: Confirm once sent
	back       []limiter.Return // the refills of the bucket the assignment made replaces: given back by Confirm once sent
}

// leaseCharge is one lease of a bucket's refills as the store charged it,
// for the give-back of a replaced bucket.
type leaseCharge struct {
	hits    []limiter.Hit // the counter's, then the fleet's count
	tokens  []int64       // naming each hit's charge (0 for the reference's keys, whose key names its window)
	charged []bool        // the hits the store charged
	units   uint64
	end     time.Time // its last refill
}

// Allow is the assignment of a bucket no limit applies to.
func (a *Allocator) Allow() Assignment { return Assignment{Kind: AllowAll, TTL: a.lease} }

// Deny is the assignment of a bucket whose limit admits nothing.
func (a *Allocator) Deny() Assignment { return Assignment{Kind: DenyAll, TTL: a.lease} }

// Report takes one report of b, the requests (allowed and denied) seen
// since the last, and returns the assignment to send. An error wraps the
// store's: no assignment is made; the one Envoy holds runs out at its TTL.
func (a *Allocator) Report(ctx context.Context, b *Bucket, lim Limit, requests uint64) (Assignment, error) {
	if len(lim.Hits) == 0 {
		return Assignment{}, errors.New("quota: a limit without hits")
	}
	gov := lim.Hits[0]
	now := a.now()
	// A give-back readied by the last report waits for its answer's
	// Confirm: none came, so Envoy may still hold the bucket it replaced.
	b.back = nil
	if !b.measured {
		// A new stream's first lease must know what others hold too.
		if err := a.measureOthers(ctx, b, lim); err != nil {
			return Assignment{}, err
		}
	}
	demand := a.measure(b, gov.Window, requests, now)
	share, err := fairshare.Assign(ctx, a.ledger, fairshare.ShareRequest{
		Key:            lim.ShareKey,
		Member:         b.Member,
		Demand:         demand,
		Limit:          uint64(gov.Limit) - min(b.others, uint64(gov.Limit)),
		Window:         gov.Window,
		Current:        b.tokens(),
		ReportInterval: a.interval,
		Lease:          a.lease + AnswerWithin,
	})
	if err != nil {
		return Assignment{}, fmt.Errorf("quota: share: %w", err)
	}
	if share.Tokens == 0 {
		// What others took may have left since: measured again for the
		// next report, the lease the Envoy may get then.
		if err := a.measureOthers(ctx, b, lim); err != nil {
			return Assignment{}, err
		}
		return a.deny(b, now), nil
	}
	ok, err := a.leaseBucket(ctx, b, lim, share.Tokens, share.MaxTokens, share.Lookahead, now)
	if err != nil || ok {
		return b.held, err
	}
	// The counter is full of what others took: the share is cut to what
	// they leave at the next report (Assign's limit); until then, nothing.
	return a.deny(b, now), nil
}

// Confirm says that the assignment Report made for b was sent. Only now
// are a replaced token bucket's refills leased ahead given back: until the
// new assignment reaches Envoy, the old one spends them (a lease that
// failed, or an answer never sent, leaves them counted: toward denying).
// Only now do the shares learn of a smaller share: until then b's counts
// the larger, which Envoy may still hold, and what b gave up goes to the
// others at their next report rather than after b's. An error wraps the
// store's; the share then stays the larger until b's next report, and
// what was not given back stays counted until its window forgets it.
func (a *Allocator) Confirm(ctx context.Context, b *Bucket, lim Limit) error {
	var errs []error
	if back := b.back; len(back) > 0 {
		b.back = nil
		if _, err := a.ledger.GiveBack(ctx, back); err != nil {
			errs = append(errs, fmt.Errorf("quota: give back: %w", err))
		}
	}
	if b.shrunk && len(lim.Hits) > 0 {
		b.shrunk = false
		if err := fairshare.Confirm(ctx, a.ledger, lim.ShareKey, b.Member, lim.Hits[0].Window, b.tokens()); err != nil {
			errs = append(errs, fmt.Errorf("quota: confirm: %w", err))
		}
	}
	return errors.Join(errs...)
}

// measure returns the Envoy's demand in units per window, with headroom,
// or -1 while it is unknown (its first report).
func (a *Allocator) measure(b *Bucket, window time.Duration, requests uint64, now time.Time) float64 {
	if b.lastReport.IsZero() {
		b.lastReport, b.demand = now, -1
		return -1
	}
	b.pending += requests
	elapsed := now.Sub(b.lastReport)
	if elapsed < a.interval/2 {
		// A new bucket's own report, then the periodic one: too short a
		// time to measure; counted with the next.
		return b.demand
	}
	perWindow := float64(b.pending) * float64(window) / float64(elapsed)
	b.demand = perWindow*headroom + 1
	b.lastReport, b.pending = now, 0
	return b.demand
}

// replacedBy reports whether tokens and maxTokens replace b's token bucket.
func (b *Bucket) replacedBy(tokens, maxTokens uint64) bool {
	return b.held.Kind == TokenBucket && (b.held.TokensPerFill != tokens || b.held.MaxTokens != maxTokens)
}

// tokens is the tokens per fill the Envoy holds, 0 for none.
func (b *Bucket) tokens() uint64 {
	if b.held.Kind != TokenBucket {
		return 0
	}
	return b.held.TokensPerFill
}

// units is what a bucket of tokens per window and maxTokens costs to
// lease until a new assignment's end: its refills not leased yet (all of
// them when the bucket is new to the Envoy), and the fraction charged
// beyond the exact amount, carried to the next lease.
func (a *Allocator) units(b *Bucket, window time.Duration, tokens, maxTokens uint64, now time.Time) (uint64, float64) {
	end := now.Add(a.lease + AnswerWithin)
	from, exact := b.leaseEnd, -b.carry // the carry was charged already
	fresh := b.held.Kind != TokenBucket || b.held.TokensPerFill != tokens || b.held.MaxTokens != maxTokens
	if fresh || from.Before(now) {
		from, exact = now, 0
	}
	exact += float64(tokens) * end.Sub(from).Seconds() / window.Seconds()
	units := math.Ceil(max(exact, 0))
	return uint64(units), units - exact
}

// leaseBucket charges the counter, and the fleet's own count (fleetHit)
// beside it, for a bucket of tokens per window and maxTokens, making it
// b's if admitted, which it reports. The two counts differ by what others
// (ShouldRateLimit's callers) took, which the next share leaves them.
func (a *Allocator) leaseBucket(ctx context.Context, b *Bucket, lim Limit, tokens, maxTokens, lookahead uint64,
	now time.Time,
) (bool, error) {
	window := lim.Hits[0].Window
	units, carry := a.units(b, window, tokens, maxTokens, now)
	end := now.Add(a.lease + AnswerWithin)
	if units == 0 && b.held.Kind == TokenBucket && !b.replacedBy(tokens, maxTokens) {
		// The bucket's refills until its new end were charged already (the
		// last lease rounded up): nothing to ask the store, whose check of
		// a full counter would deny the renewal of a fleet at its limit.
		b.leaseEnd, b.carry = end, carry
		return true, nil
	}
	// A counter nobody else took from is the fleet's, held to the limit by
	// the shares: its lease is recorded whatever the counter says (its
	// rounding would deny a fleet at 100 %), unless the store finds in the
	// same call that others took since b.others was measured
	// (RecordIfAlone). Otherwise others come first: the lease must fit
	// beside what they took, the other Envoys' leases ahead and a replaced
	// bucket's refills, still counted so that their give-back (Confirm)
	// goes to the others rather than to its successor.
	alone := b.others <= aloneSlack
	// The lease is a slice of the counter used until the assignment's end
	// (limiter.Hit.Ahead): a client's refund of the log or GCRA never takes
	// it (the counters' takes from the current window's count:
	// docs/accuracy.md), and its give-back takes back at most what the
	// store holds of it.
	hits := make([]limiter.Hit, len(lim.Hits)+1)
	for i, h := range lim.Hits {
		h.Cost, h.Record, h.RecordIfAlone, h.Ahead = units, alone && units > 0, true, end.Sub(now)
		if h.Algorithm.Bucket() {
			h.Burst = raised(uint64(cmp.Or(h.Burst, h.Limit)), lookahead)
		} else {
			h.Limit = raised(uint64(h.Limit), lookahead)
		}
		hits[i] = h
	}
	fleet := fleetHit(lim.Hits[0])
	fleet.Cost, fleet.Record, fleet.RecordIfAlone, fleet.Ahead = units, alone && units > 0, true, end.Sub(now) // charged with the counter, even past it
	hits[len(lim.Hits)] = fleet
	verdicts, err := a.ledger.Decide(ctx, hits)
	if err != nil {
		return false, fmt.Errorf("quota: lease: %w", err)
	}
	// Charged or not (all or nothing), the two counts are read alike.
	b.others = others(hits[0], fleet, verdicts[0], verdicts[len(lim.Hits)])
	for _, v := range verdicts[:len(lim.Hits)] {
		if !v.Admitted && (!alone || !v.Charged) {
			return false, nil
		}
	}
	b.replace(tokens, maxTokens, now)
	b.shrunk = b.tokens() > tokens
	b.held = Assignment{Kind: TokenBucket, MaxTokens: maxTokens, TokensPerFill: tokens, FillInterval: window, TTL: a.lease}
	b.leaseEnd, b.carry = end, carry
	b.charges = slices.DeleteFunc(b.charges, func(c leaseCharge) bool { return !c.end.After(now) })
	if units > 0 {
		c := leaseCharge{hits: hits, tokens: make([]int64, len(hits)), charged: make([]bool, len(hits)), units: units, end: end}
		for i, v := range verdicts {
			c.tokens[i], c.charged[i] = v.Token, v.Charged
		}
		b.charges = append(b.charges, c)
	}
	return true, nil
}

// aloneSlack is what others may hold on a counter still the fleet's alone:
// the two counts' rounding, a unit, as rlqs_lease.lua's alone_fleet allows.
const aloneSlack = 1

// measureOthers reads b.others off the counter without charging it.
func (a *Allocator) measureOthers(ctx context.Context, b *Bucket, lim Limit) error {
	// Unbounded, so that the count is read whole; a check charges nothing.
	hits := []limiter.Hit{fleetHit(lim.Hits[0]), fleetHit(lim.Hits[0])}
	hits[0].Key = lim.Hits[0].Key
	verdicts, err := a.ledger.Decide(ctx, hits)
	if err != nil {
		return fmt.Errorf("quota: measure: %w", err)
	}
	b.others, b.measured = others(hits[0], hits[1], verdicts[0], verdicts[1]), true
	return nil
}

// others is what the counter of h holds that the fleet did not lease, by
// the verdicts of h and of its fleet count.
func others(h, fleet limiter.Hit, onCounter, onFleet limiter.Verdict) uint64 {
	counted := uint64(h.Capacity()) - min(onCounter.Remaining, uint64(h.Capacity()))
	leased := uint64(fleet.Capacity()) - min(onFleet.Remaining, uint64(fleet.Capacity()))
	return counted - min(leased, counted)
}

// LeasedAhead is how many refills of the token bucket b holds are charged
// to the counter ahead of now, not yet made (rounded up): what the counter
// holds for the bucket beyond what Envoy took.
func (b *Bucket) LeasedAhead(now time.Time) uint64 {
	if b.held.Kind != TokenBucket || !b.leaseEnd.After(now) {
		return 0
	}
	rate := float64(b.held.TokensPerFill) / b.held.FillInterval.Seconds()
	return uint64(math.Ceil(rate*b.leaseEnd.Sub(now).Seconds() + b.carry))
}

// replace readies, when a bucket of tokens and maxTokens replaces the token
// bucket b holds (Envoy drops the old one as the new one arrives), the
// give-back of the old one's refills leased ahead (b.back, for Confirm),
// newest lease first, by its charges' tokens: at most what the store still
// holds of them (limiter.GiveBack). The old bucket's leases are forgotten.
func (b *Bucket) replace(tokens, maxTokens uint64, now time.Time) {
	held, charges := b.held, b.charges
	if !b.replacedBy(tokens, maxTokens) {
		return
	}
	ahead := b.leaseEnd.Sub(now) - AnswerWithin
	b.leaseEnd, b.carry, b.charges, b.back = now, 0, nil, nil
	if ahead <= 0 {
		return
	}
	left := uint64(float64(held.TokensPerFill) * ahead.Seconds() / held.FillInterval.Seconds())
	for i := len(charges) - 1; i >= 0 && left > 0; i-- {
		c := charges[i]
		n := min(left, c.units)
		for j, h := range c.hits {
			if c.charged[j] {
				b.back = append(b.back, limiter.Return{Hit: h, Token: c.tokens[j], Units: n})
			}
		}
		left -= n
	}
}

// fleetHit is the fleet's own count of the units leased on h's counter:
// the same window (and, for GCRA, rate), at a key of its own beside h's (in
// its hash slot), with no bound of its own.
func fleetHit(h limiter.Hit) limiter.Hit {
	f := limiter.Hit{Key: h.Key + limiter.FleetSuffix, Algorithm: h.Algorithm, Limit: math.MaxUint32, Window: h.Window, Calendar: h.Calendar}
	if h.Algorithm.Bucket() {
		f.Limit, f.Burst = h.Limit, math.MaxUint32
	}
	return f
}

// deny makes DENY_ALL b's assignment, readying the give-back of what the
// bucket it replaces leased ahead (Confirm makes it).
func (a *Allocator) deny(b *Bucket, now time.Time) Assignment {
	b.replace(0, 0, now)
	b.shrunk = b.tokens() > 0
	b.held, b.leaseEnd, b.carry = a.Deny(), now, 0
	return b.held
}

// raised returns capacity plus raise, at most the largest uint32.
func raised(capacity, raise uint64) uint32 {
	return uint32(min(capacity+raise, math.MaxUint32))
}
