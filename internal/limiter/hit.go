package limiter

import (
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// FleetSuffix ends the key of an RLQS fleet's own count of what it leased
// from the counter whose key comes before it (see Hit.RecordIfAlone).
const FleetSuffix = lua.FleetSuffix

// Hit asks whether Cost more units fit Limit per Window on the counter Key.
type Hit struct {
	// Key is the store key, built with KeyBuilder.
	Key string
	// Algorithm decides how the window slides.
	Algorithm config.Algorithm
	// Limit is the number of units the window admits.
	Limit uint32
	// Window is the length of the window, a whole number of seconds; with
	// a Calendar, the unit's nominal length (30 days for a month).
	Window time.Duration
	// Calendar aligns a fixed window to the calendar (weeks, months and
	// years, in a time zone). The limiter sends the edges of the windows
	// around its clock (Options.Now); the store counts in the one holding
	// Redis TIME.
	Calendar config.Calendar
	// Cost is the number of units this hit consumes; 0 checks without
	// consuming, and is denied while nothing remains.
	Cost uint64
	// Burst is, for GCRA, the size of the bucket in units; 0 means Limit.
	// Other algorithms ignore it.
	Burst uint32
	// Shadow marks a hit that is evaluated and accounted as usual, but whose
	// denial does not deny the request.
	Shadow bool
	// Quota marks a hit of a quota-mode limit (the reference's quota_mode).
	// The quota hits of one QuotaGroup are one quota, which fits when each
	// of them fits; a request with quotas fits when one of them does (and
	// every other enforced hit). A quota that does not fit charges none of
	// its hits but a Record one. Shadow wins over Quota.
	Quota bool
	// QuotaGroup names a Quota hit's quota: the service gives a
	// descriptor's limits its index in the request.
	QuotaGroup uint32
	// Record marks a cost spent before it was reported (Envoy's
	// apply_on_stream_done): charged whether it fits or not, whatever the
	// request's other hits say. Past the limit it is a debt, which denies
	// later hits until the window slides past it (the hit is then denied,
	// and still Charged).
	Record bool
	// RecordIfAlone makes a Record conditional, for an RLQS fleet's lease:
	// recorded past their limits only when each counter holds at most one
	// unit more than the fleet's own count of it (the request's hit at Key
	// + FleetSuffix: the fleet is then the counter's only user, and its
	// shares bound it), decided in the store call that charges them; else
	// (or without the fleet's hit in the call) decided as without Record.
	RecordIfAlone bool
	// Refund marks a hit that gives Cost units back instead of taking them
	// (Envoy's is_negative_hits): never below zero, never units of another
	// window than the current one (docs/accuracy.md says each algorithm's).
	// It is always admitted and applied, and drops the deny cache's entry.
	Refund bool
	// Ahead makes the charge a slice (internal/hotkeys), whose units are
	// used over the Ahead that follows. The log records it that far ahead
	// of Redis's now, the last instant a unit can be used, so that every
	// window holding a use holds its members too. The counters and GCRA
	// record it beside their count, named by the negative Verdict.Token, so
	// that GiveBack takes back at most what the store still holds of it.
	Ahead time.Duration
	// Lease makes the charge a lease (the sliding window log only): its
	// units are named by a random id, Verdict.Lease, that only Settle frees,
	// and leave the count by themselves LeaseTTL after the charge (a
	// concurrency limit's seat, a reservation of an estimated cost). Never
	// answered from the deny cache: a settlement may free it any moment.
	Lease bool
	// LeaseTTL is how long a lease lives unsettled; 0 means Window.
	LeaseTTL time.Duration
	// Settle closes the lease this id (a Verdict.Lease) names on Key: its
	// units leave the count and Cost, the actual cost, is recorded in their
	// place, even past the limit. Applied as a Refund is. An id that names
	// no lease (settled, expired, or made up) frees nothing; Cost is
	// recorded all the same.
	Settle string
	// FailureMode answers the hit when the store cannot: a denial, or an
	// admission that charged nothing (allow and FailureDefer, which the
	// caller tells apart).
	FailureMode config.FailureMode

	// part marks a hit of a request that Split decides on two stores: its
	// charge may be given back (see partArg).
	part bool
}

// Verdict is the answer for one Hit.
type Verdict struct {
	// Admitted reports that the hit fits its limit.
	Admitted bool
	// Charged reports that the hit's cost was recorded: not for an
	// admitted hit of a denied request; for a Record hit even when denied.
	Charged bool
	// CostExceedsLimit reports a hit whose cost is larger than its limit,
	// denied without asking the store.
	CostExceedsLimit bool
	// FailureVerdict reports an answer by the hit's FailureMode, given
	// because the store could not answer.
	FailureVerdict bool
	// Remaining is the number of units still available after this decision.
	Remaining uint64
	// ResetAfter is, for an admitted hit, the time until the window is
	// empty again; for a denied hit, until its cost would fit if nothing
	// else came; for a denied Record hit and a Refund, until one unit fits.
	ResetAfter time.Duration
	// Token names a charge the store made, for its undo: the log's score,
	// the counters' window index, GCRA's TAT after the charge (Unix
	// microseconds); for a counter's or GCRA's slice (Hit.Ahead), its
	// record's name, negative; 0 when nothing was charged.
	Token int64
	// Lease is the id of the lease a Lease hit's charge took, for Settle;
	// empty when nothing was charged.
	Lease string

	// part is the nonce that names the members of a log charge made as a
	// part of a request (partArg), for its give-back.
	part string
	// generation counts the Resets a counter's or GCRA's key saw at the
	// charge: its give-back takes nothing once a Reset came between.
	generation int64
}
