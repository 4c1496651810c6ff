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
	// Window is the length of the window, a whole number of seconds. With
	// a Calendar it is the unit's nominal length (30 days for a month),
	// which the store's answers do not use.
	Window time.Duration
	// Calendar aligns a fixed window to the calendar (its weeks, months and
	// years, in a time zone); zero for windows of the length Window. The
	// limiter sends the edges of the windows around its clock (Options.Now)
	// and the store counts in the one holding Redis TIME.
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
	// The quota hits with one QuotaGroup are one quota, which fits only when
	// each of them fits: a request with quota hits fits only when at least
	// one of its quotas does, besides every enforced hit that is not a
	// quota hit. A quota that does not fit charges none of its hits (but a
	// Record one), as a denied request charges none of its own. Shadow wins
	// over Quota.
	Quota bool
	// QuotaGroup names the quota a Quota hit is part of: the service gives
	// each descriptor's limits its index in the request, so that a
	// descriptor over one of its limits is charged on none.
	QuotaGroup uint32
	// Record marks a cost that was spent before it was reported (Envoy's
	// apply_on_stream_done: tokens streamed, bytes sent): it is charged
	// whether it fits or not, and whatever the request's other hits say. Past
	// the limit it is a debt, which denies later hits until the window has
	// slid past it; the hit is then denied, and still Charged.
	Record bool
	// RecordIfAlone makes a Record conditional, for an RLQS fleet's lease:
	// the request's RecordIfAlone hits are recorded past their limits only
	// when each counter holds at most one unit more than the fleet's own
	// count of it, the request's hit at its Key + FleetSuffix (the fleet is
	// then the counter's only user, and its shares bound it). Decided in the
	// store, in the call that charges them: a count read earlier may miss
	// what others took since. Else they are decided as hits without Record.
	// Without the fleet's hit in the store call (another limit of the
	// rule, on another Cluster slot), they are decided as without Record.
	RecordIfAlone bool
	// Refund marks a hit that gives Cost units back to the counter instead of
	// taking them (Envoy's is_negative_hits): never below zero, and never
	// units of another window than the current one (see scripts/lua). It is
	// always admitted and applied whatever the request's other hits say, and
	// it drops the deny cache's entry of the counter.
	Refund bool
	// Ahead makes the charge a hot key's slice (internal/hotkeys' Slices),
	// whose units are used over the Ahead that follows. The sliding window
	// log records it that far ahead of Redis's now, at the last instant a
	// unit can be used, so that every window holding a use holds its
	// members too (their slices end where their window does). The
	// counters and GCRA record the lease beside their count, named by the
	// negative Verdict.Token, so that its give back (GiveBack) takes back
	// at most what the store still holds of it: nothing after a failover
	// lost it, or a Reset deleted it.
	Ahead time.Duration
	// Lease makes the hit's charge a lease (the sliding window log only,
	// Decide refuses it on another algorithm): its units are named by a
	// random id, Verdict.Lease, that only Settle frees, and they leave the
	// count by themselves LeaseTTL after the charge when no settlement came
	// (a concurrency limit's seat, a reservation of an estimated cost). A
	// lease is never answered from the deny cache: a settlement on another
	// instance may free it at any moment.
	Lease bool
	// LeaseTTL is how long a lease lives unsettled; 0 means Window.
	LeaseTTL time.Duration
	// Settle closes the lease this id names (a Verdict.Lease), on the same
	// Key: its units leave the count, and Cost, the actual cost, is
	// recorded in their place at once, even past the limit (a cost already
	// spent). It never denies and is applied whatever the request's other
	// hits say, as a Refund. An id that names no lease (settled already,
	// expired, or made up: whatever a client sent) frees nothing, and Cost
	// is recorded all the same.
	Settle string
	// FailureMode answers the hit when the store cannot. Deny gives a
	// denial; allow and FailureDefer (zero) give an admission that charged
	// nothing, and the caller tells those two apart.
	FailureMode config.FailureMode

	// part marks a hit of a request that Split decides on two stores: its
	// charge may be given back (see partArg).
	part bool
}

// Verdict is the answer for one Hit.
type Verdict struct {
	// Admitted reports that the hit fits its limit.
	Admitted bool
	// Charged reports that the hit's cost was recorded. An admitted hit is
	// not charged when another enforced hit of the same request was denied;
	// a Record hit is charged even when denied.
	Charged bool
	// CostExceedsLimit reports a hit whose cost is larger than its limit:
	// it can never be admitted, so it was denied without asking the store.
	CostExceedsLimit bool
	// FailureVerdict reports an answer by the hit's FailureMode, given
	// because the store could not answer.
	FailureVerdict bool
	// Remaining is the number of units still available after this decision.
	Remaining uint64
	// ResetAfter is, for an admitted hit, the time until the window is
	// empty again; for a denied hit, the time until its cost would fit,
	// provided nothing else arrives meanwhile; for a Record hit that was
	// denied, and for a Refund that left nothing, until one unit fits.
	ResetAfter time.Duration
	// Token names a charge the store made, for GiveBack and the refunds
	// that make a request all or nothing: the log's score, the counters'
	// window index, GCRA's TAT after the charge (the end of its time, in
	// Unix microseconds); for a slice (Hit.Ahead) of a
	// counter or GCRA, its record's name, negative; 0 when nothing was
	// charged.
	Token int64
	// Lease is the id of the lease a Lease hit's charge took, for Settle;
	// empty when nothing was charged.
	Lease string

	// part is the nonce that names the members of a log charge made as a
	// part of a request (partArg), for its give-back.
	part string
	// generation is a counter's or GCRA's, as the charge found it: the
	// Resets its key saw (decide.lua's reply). Its give-back names it, and
	// takes nothing once a Reset came between.
	generation int64
}
