// Package limiter decides rate limits on Redis. It knows nothing of gRPC or
// Envoy: it takes hits (a key, an algorithm, a limit, a window, a cost) and
// answers, per hit, whether it fits, what is left and when the limit frees up.
//
// Every request is decided atomically by Lua code (see scripts/lua) with
// Redis TIME as the clock. Concurrent requests to one server are batched:
// the requests of one hash slot that wait at the same moment are decided by
// one call, in order (see batcher). The code runs as a Redis Functions
// library where the server has them (FCALL, loaded by Prepare or on first
// use) and as a script otherwise (EVALSHA, re-sent with EVAL after NOSCRIPT).
//
// KeyBuilder names the counters: in this service's schema, or, for an
// algorithm with the reference's keys (reference_fixed_window), in
// envoyproxy/ratelimit's own, so that its replicas and this service share
// them. Such a key names its window by the Go side's clock (KeyBuilder.Now),
// as the reference's replicas name it by theirs: the one clock that is not
// Redis TIME.
//
// Split sends the hits of one-second windows to a limiter on a store of
// their own (envoyproxy/ratelimit's REDIS_PERSECOND), the others to the
// main one.
//
// A Lease hit's charge on the sliding window log names itself with a random
// id (lease.go) that a Settle hit later frees, replacing it by an actual
// cost; a lease not settled leaves the count at its TTL by itself.
//
// Share keeps, beside a counter, the registry of its RLQS assignments (one
// entry per Envoy stream, shares.go) and decides one Envoy's fair share of
// the limit so that the live assignments never sum past it.
//
// A request's store work is bounded by its caller's deadline, less a margin
// to answer in time, and by the limiter's timeout. A deadline that passes
// while the request waits in the limiter is an overload (ErrOverloaded), not
// a store failure (ErrStore). Each batch of Redis calls is a tracing span
// of its own, linked to the spans of the requests it carries (see batcher).
//
// What denies a request (enforced, shadow, quota, record and refund hits) is
// one rule, requestRule (outcome.go), whose twin in decide.lua applies it on
// Redis. All or nothing takes three mechanisms, one per boundary a request
// can cross, each said where it lives: within a hash slot, decide.lua (one
// atomic call per slot); across Redis Cluster slots, a refund of the charges
// by token (refund.go); across Split's two stores, a refund by Refund hits
// (split.go). The last two share takeBack.
//
// Clocks, one per decision path:
//   - a decision, a refund, a share: Redis TIME, read once per call (a
//     batch's requests are decided at one instant);
//   - the window a key in the reference's schema names: KeyBuilder.Now,
//     which the service reads from its own Options.Now once per request;
//   - the deny cache (denycache.go), and the edges of calendar windows
//     (Hit.Calendar) sent around it, which Redis TIME then picks from:
//     Options.Now, time.Now by default;
//   - deadlines, timeouts, the durations Observe gets and the tracing
//     spans: the real clock, as the caller's deadline is.
//
// The app gives the service and the limiter one clock for Options.Now.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// DefaultTimeout bounds a request's store work when Options do not say. It
// is an upper bound: the caller's own deadline (Envoy's rate limit filter
// sends 20 ms by default) is what normally ends the wait.
const DefaultTimeout = time.Second

// maxAnswerMargin is the most of the caller's time kept back to send the
// answer; a tenth of the time left when that is less.
const maxAnswerMargin = 2 * time.Millisecond

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
	// Refund marks a hit that gives Cost units back to the counter instead of
	// taking them (Envoy's is_negative_hits): never below zero, and never
	// units of another window than the current one (see scripts/lua). It is
	// always admitted and applied whatever the request's other hits say, and
	// it drops the deny cache's entry of the counter.
	Refund bool
	// RefundOldest makes a Refund of the sliding window log give back its
	// oldest units instead of its newest: the release of a concurrency limit
	// (refund_order: oldest). Other algorithms' counts have no order.
	RefundOldest bool
	// NoSlices keeps the hit off the slices of hot keys (internal/quota's
	// Slices): decided on the store every time, as a rule with
	// hot_key_slices: false, or a concurrency rule, asks.
	NoSlices bool
	// Ahead records a charge of the sliding window log that far ahead of
	// Redis's now: a lease (internal/quota's Slices) whose units are used
	// over the Ahead that follows is recorded at the last instant one can
	// be, so that every window holding a use holds its members too. Other
	// algorithms ignore it: their slices end where their window does.
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
	// Token names a charge the store made, for GiveBack: the log's score,
	// the counters' window index; 0 for GCRA and when nothing was charged.
	Token int64
	// Lease is the id of the lease a Lease hit's charge took, for Settle;
	// empty when nothing was charged.
	Lease string
}

// Options configure a Limiter. A nil *Options means the defaults.
type Options struct {
	// Timeout bounds a request's store work, queueing included, when the
	// caller's deadline is later or absent; zero means DefaultTimeout.
	Timeout time.Duration
	// Observe, when set, is called after every store call with its
	// duration and error (nil on success); see ErrorKind. A request whose
	// deadline passed before it was sent is not a store call: Decide
	// reports it with ErrOverloaded.
	Observe func(d time.Duration, err error)
	// Overloaded, when set, is called for every request whose deadline
	// passed before its store call was sent (Decide returns ErrOverloaded).
	Overloaded func()
	// DenyCache is how long at most a denial Redis gave may be repeated
	// from memory for the same counter (see denyCache); zero means
	// DefaultDenyCache, a negative value turns the cache off. It reads Now,
	// not Redis's clock: tests that move Redis's clock by hand turn it off,
	// or move Now with it.
	DenyCache time.Duration
	// Now is the clock of the deny cache and of the calendar windows' edges
	// sent to the store (Hit.Calendar); nil means time.Now. Deadlines and
	// the durations Observe gets are on the real clock whatever it says.
	// The app gives the service's Options.Now (the reference's keys'
	// clock) here too.
	Now func() time.Time
	// TracerProvider gives the tracer of the spans of Redis batches (see
	// batcher); nil means OpenTelemetry's global provider, a no-op unless
	// one was installed.
	TracerProvider trace.TracerProvider
}

// tracerName names the limiter's tracer (instrumentation scope).
const tracerName = "github.com/slidingwindow/ratelimit/internal/limiter"

// DefaultDenyCache bounds how long a denial is repeated from memory.
const DefaultDenyCache = time.Second

// Limiter decides hits against a Redis store. It is safe for concurrent use.
type Limiter struct {
	router     router
	timeout    time.Duration
	observe    func(time.Duration, error)
	overloaded func()
	denied     *denyCache // nil: off
	now        func() time.Time
	tracer     trace.Tracer

	batchers sync.Map       // redis.UniversalClient to its *batcher
	refunds  sync.WaitGroup // refunds still running after their answers

	// life is held for reading by Decide and Reset, for writing by Close,
	// which thus waits for the calls in flight and refuses later ones.
	life   sync.RWMutex
	closed bool
	stop   chan struct{} // ends the sweep of a cluster's batchers
	swept  sync.WaitGroup
}

// decideScript is shared by every Limiter: a *redis.Script only holds the
// source and its hash.
var decideScript = redis.NewScript(lua.Decide())

// New returns a Limiter on store: go-redis's *Client (standalone or a
// Sentinel failover client) or *ClusterClient, or a UniversalClient holding
// one of them. On a cluster, the hits of a request are grouped by hash slot
// and each group runs on its slot's master, all groups at once.
//
// Concurrent requests' scripts share pipelines to each server (see batcher);
// Close stops them.
func New(store redis.UniversalClient, opts *Options) *Limiter {
	var r router = singleRouter{store}
	if cc, ok := store.(*redis.ClusterClient); ok {
		r = newClusterRouter(cc)
	}
	return newWithRouter(r, opts)
}

func newWithRouter(r router, opts *Options) *Limiter {
	l := &Limiter{router: r, timeout: DefaultTimeout, observe: func(time.Duration, error) {}, overloaded: func() {},
		now: time.Now, stop: make(chan struct{})}
	if opts != nil && opts.Now != nil {
		l.now = opts.Now
	}
	if opts != nil && opts.Timeout > 0 {
		l.timeout = opts.Timeout
	}
	if opts != nil && opts.Observe != nil {
		l.observe = opts.Observe
	}
	if opts != nil && opts.Overloaded != nil {
		l.overloaded = opts.Overloaded
	}
	tp := otel.GetTracerProvider()
	if opts != nil && opts.TracerProvider != nil {
		tp = opts.TracerProvider
	}
	l.tracer = tp.Tracer(tracerName)
	switch {
	case opts == nil || opts.DenyCache == 0:
		l.denied = newDenyCache(DefaultDenyCache, l.now())
	case opts.DenyCache > 0:
		l.denied = newDenyCache(opts.DenyCache, l.now())
	}
	if _, ok := r.(*clusterRouter); ok {
		l.swept.Go(l.sweepEvery)
	}
	return l
}

// sweepInterval is how often the batchers of servers that left a cluster
// are stopped. go-redis forgets a node a minute after it left the slot map.
const sweepInterval = time.Minute

func (l *Limiter) sweepEvery() {
	ticker := time.NewTicker(sweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-ticker.C:
			l.sweep(context.Background())
		}
	}
}

// sweep stops the batchers of servers that are no longer masters: after
// failovers and reshardings, nothing would ever call them again.
func (l *Limiter) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*l.timeout)
	defer cancel()
	live, err := l.router.live(ctx)
	if err != nil {
		return // keep every batcher: better idle than gone
	}
	l.batchers.Range(func(server, b any) bool {
		if !slices.Contains(live, server.(redis.UniversalClient)) && l.batchers.CompareAndDelete(server, b) {
			b.(*batcher).close()
		}
		return true
	})
}

// Prepare makes every server in use ready for decisions: the decide code
// loaded and a connection open per batcher worker, so that the first
// requests pay no setup. A server may still lose them later (a restart, a
// failover): calls load the code again as needed.
func (l *Limiter) Prepare(ctx context.Context) error {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return ErrClosed
	}
	servers, err := l.router.live(ctx)
	if err != nil {
		return fmt.Errorf("%w: prepare: %w", ErrStore, err)
	}
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, server := range servers {
		wg.Go(func() { errs[i] = l.batcher(server).prepare(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: prepare: %w", ErrStore, err)
	}
	return nil
}

// ErrStore wraps every failure to get an answer from the store (unreachable,
// timed out, or an unexpected reply).
var ErrStore = errors.New("rate limit store")

var errBadReply = errors.New("unexpected reply")

// ErrorKind classifies a store error for metrics: "overload" (the deadline
// passed before the call was sent), "canceled" (the caller gave up),
// "timeout" (the deadline passed), "redis" (Redis answered with an error),
// "reply" (an answer of the wrong shape), "connection" (anything else:
// refused, reset, closed); "" for nil.
func ErrorKind(err error) string {
	if err == nil {
		return "" // before the targets of errors.As, which escape
	}
	var redisErr redis.Error
	var netErr net.Error
	switch {
	case errors.Is(err, ErrOverloaded):
		return "overload"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	case errors.Is(err, errBadReply):
		return "reply"
	case errors.As(err, &redisErr):
		return "redis"
	}
	return "connection"
}

// FailureRetry is the wait announced by a failure_mode deny: short, since the
// store may be back at any moment.
const FailureRetry = time.Second

// Decide decides the hits of one request atomically and returns a verdict
// per hit, in the order of hits.
//
// All or nothing: when any enforced hit that is not a Quota hit does not
// fit, or when the request has quotas (Hit.QuotaGroup) and none of them
// fits whole, none is charged; nor is any hit of a quota that does not fit.
// Hits on the same Key are one demand on one counter: their costs add up
// against the smallest of their limits, and each of them gets the merged
// verdict. Two quotas with such a demand in common are charged together
// or not at all, so they are one quota: when it does not fit, the common
// demand is answered denied (it was not charged), with the longest wait of
// its quota's denials.
//
// When the store cannot answer, Decide returns an error wrapping ErrStore,
// or ErrOverloaded when the deadline passed before the request was sent,
// together with verdicts decided by each hit's FailureMode (FailureVerdict
// set). Across Redis Cluster slots, a failure is per slot group: the other
// groups' verdicts are real. A hit whose Algorithm is not one of config's
// fails the whole request the same way, before anything is sent, with an
// error that wraps neither.
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

// decide decides hits with distinct keys: one script per slot group (a
// script's keys must share a slot), all groups at once. Across groups, all or nothing holds by refunding: each
// group charges what fits in it, and when the request turned out denied,
// the charges of the other groups are taken back, as are those of a quota
// that turned out over.
func (l *Limiter) decide(ctx context.Context, hits []Hit) ([]Verdict, error) {
	verdicts := make([]Verdict, len(hits))
	sent := make([]int, 0, len(hits))
	// rule tallies what is known before the store answers: the hits denied
	// here, and the hits sent, which only the store can deny (counted as
	// fitting). When it denies already, the store only checks.
	var rule requestRule
	now := l.now()
	for i := range hits {
		h := &hits[i]
		switch {
		case h.Record || h.givesBack():
			sent = append(sent, i) // a cost already spent, or given back: always to the store
			rule.add(h, true)
		case h.Cost > uint64(h.capacity()):
			// Never admissible: answer at once, without a store write.
			verdicts[i] = Verdict{CostExceedsLimit: true, ResetAfter: h.windowLeft(now)}
			rule.add(h, false)
		case h.quota(), h.Lease:
			// Not from the deny cache: a quota hit's denial alone does not
			// deny the request, the store's answers for the other quotas
			// decide; and a settlement, on any instance, frees a lease at
			// any moment.
			sent = append(sent, i)
			rule.add(h, true)
		default:
			if l.denied != nil && !h.Shadow {
				if v, ok := l.denied.lookup(*h, now); ok {
					verdicts[i] = v // Redis denied it moments ago and would again
					rule.add(h, false)
					continue
				}
			}
			sent = append(sent, i)
			rule.add(h, true)
		}
	}
	charge := !rule.denied()
	if len(sent) == 0 {
		return verdicts, nil
	}
	deadline := l.deadline(ctx)
	if slot := l.router.slot(hits[sent[0]].Key); l.inSlot(hits, sent, slot) {
		// Nearly always (always outside a cluster): one group, which needs
		// no refund tokens.
		return verdicts, l.run(ctx, deadline, hits, slot, sent, charge, &rule, verdicts, nil)
	}

	tokens := make([]int64, len(hits))
	slots, groups := l.groups(hits, sent)
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for g, group := range groups {
		// A slot does not see the quota hits of the others: its quota hits go
		// as shadow hits, and the refund below applies the quota rule.
		wg.Go(func() { errs[g] = l.run(ctx, deadline, hits, slots[g], group, charge, nil, verdicts, tokens) })
	}
	wg.Wait()
	if charge {
		if back := takenBack(hits, verdicts); back != nil {
			l.refund(ctx, hits, groups, verdicts, tokens, back)
		}
	}
	return verdicts, errors.Join(errs...)
}

// deadline is when a request's store work must end: its caller's deadline
// less a margin to send the answer, and at most the limiter's timeout from
// now. It goes with the request rather than in a context of its own, which
// would start a second timer per request besides the caller's.
func (l *Limiter) deadline(ctx context.Context) time.Time {
	now := time.Now()
	deadline := now.Add(l.timeout)
	if d, ok := ctx.Deadline(); ok {
		d = d.Add(-min(maxAnswerMargin, d.Sub(now)/10))
		if d.Before(deadline) {
			deadline = d
		}
	}
	return deadline
}

// inSlot reports whether the hits at indexes sent are all in slot.
func (l *Limiter) inSlot(hits []Hit, sent []int, slot int) bool {
	for _, i := range sent {
		if l.router.slot(hits[i].Key) != slot {
			return false
		}
	}
	return true
}

// groups splits the hits at indexes sent by hash slot, keeping their order.
func (l *Limiter) groups(hits []Hit, sent []int) (slots []int, groups [][]int) {
	for _, i := range sent {
		slot := l.router.slot(hits[i].Key)
		g := slices.Index(slots, slot)
		if g < 0 {
			slots = append(slots, slot)
			groups = append(groups, nil)
			g = len(groups) - 1
		}
		groups[g] = append(groups[g], i)
	}
	return slots, groups
}

// run decides the hits at indexes group, which share slot, as one request
// of a batch, and writes their verdicts, and their refund tokens when
// tokens is not nil. quotas is the request's rule as known before the
// store (which quotas are over already); nil sends quota hits as shadow
// hits. On an error the verdicts follow each hit's failure mode.
func (l *Limiter) run(ctx context.Context, deadline time.Time, hits []Hit, slot int, group []int, charge bool, quotas *requestRule,
	verdicts []Verdict, tokens []int64) error {
	keys := make([]string, len(group))
	var nonces []string // of the group's leases, by index in group
	args := make([]any, 1, 1+len(group))
	args[0] = len(group)
	if !charge {
		args[0] = -len(group)
	}
	now := l.now()
	for j, i := range group {
		keys[j] = hits[i].Key
		arg, err := hitArg(&hits[i], quotas, now)
		if err != nil { // Decide refused such a hit already
			for _, i := range group {
				verdicts[i] = failureVerdict(hits[i])
			}
			return fmt.Errorf("decide: %w", err)
		}
		if hits[i].Lease || hits[i].Settle != "" {
			var nonce string
			if arg, nonce = leaseArg(arg, &hits[i]); hits[i].Lease {
				if nonces == nil {
					nonces = make([]string, len(group))
				}
				nonces[j] = nonce
			}
		}
		args = append(args, arg)
	}
	start, sent := time.Now(), l.now()
	server, err := l.server(ctx, deadline, keys[0])
	var reply []int64
	if err == nil {
		reply, err = l.batcher(server).decide(ctx, deadline, slot, keys, args)
	}
	defer l.rememberDenials(hits, group, verdicts, sent)
	if err != nil {
		for _, i := range group {
			verdicts[i] = failureVerdict(hits[i])
		}
		if errors.Is(err, ErrOverloaded) {
			l.overloaded()
			return fmt.Errorf("decide: %w", err)
		}
		l.observe(time.Since(start), err)
		if ctx.Err() == nil && time.Now().Before(deadline) {
			l.router.failed(err)
		}
		return fmt.Errorf("%w: decide: %w", ErrStore, err)
	}
	l.observe(time.Since(start), nil)
	for j, i := range group {
		r := reply[4*j : 4*j+4]
		verdicts[i] = Verdict{
			Admitted:   r[0] == 1 || r[0] == 2,
			Charged:    r[0] >= 2,
			Remaining:  uint64(max(r[1], 0)),
			ResetAfter: time.Duration(r[2]) * time.Microsecond,
			Token:      r[3],
		}
		if r[0] == 2 && nonces != nil && nonces[j] != "" {
			verdicts[i].Lease = leaseID(min(hits[i].Cost, uint64(hits[i].Limit)), nonces[j])
		}
		if tokens != nil {
			tokens[i] = r[3]
		}
	}
	return nil
}

// server returns the server of key's slot. On a cluster that can wait for
// the slot map, which the request's deadline bounds.
func (l *Limiter) server(ctx context.Context, deadline time.Time, key string) (redis.UniversalClient, error) {
	if _, single := l.router.(singleRouter); !single {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	return l.router.server(ctx, key)
}

// rememberDenials puts the group's enforced denials in the deny cache, and
// drops the entries of counters a refund gave units back to. A Record hit's
// denial is not kept: the next report must reach the store to be recorded.
func (l *Limiter) rememberDenials(hits []Hit, group []int, verdicts []Verdict, sent time.Time) {
	if l.denied == nil {
		return
	}
	for _, i := range group {
		h, v := hits[i], verdicts[i]
		switch {
		case h.givesBack():
			l.denied.forget(h.Key)
		case !v.Admitted && !v.FailureVerdict && !h.Shadow && !h.Record && !h.Lease:
			l.denied.remember(h, v, sent)
		}
	}
}

// script runs s on the server of keys (which share a slot), in that
// server's next pipeline.
func (l *Limiter) script(ctx context.Context, s *redis.Script, keys []string, args []any) *redis.Cmd {
	server, err := l.router.server(ctx, keys[0])
	if err != nil {
		return errCmd(ctx, err)
	}
	cmd := l.batcher(server).do(ctx, s, keys, args)
	// A caller that gave up says nothing of the cluster's layout.
	if cmd.Err() != nil && ctx.Err() == nil {
		l.router.failed(cmd.Err())
	}
	return cmd
}

// batcher returns the batcher of server, starting it on first use. A
// cluster's servers are its slot masters: the map grows with the masters
// seen, which a failover adds to.
func (l *Limiter) batcher(server redis.UniversalClient) *batcher {
	if b, ok := l.batchers.Load(server); ok {
		return b.(*batcher)
	}
	b := newBatcher(server, l.timeout, l.router.node, l.tracer)
	if prev, loaded := l.batchers.LoadOrStore(server, b); loaded {
		b.close() // another call started one first
		return prev.(*batcher)
	}
	return b
}

// ErrClosed answers the calls made after Close, by failure mode.
var ErrClosed = fmt.Errorf("%w: limiter closed", ErrStore)

// Close waits for the calls in flight and the refunds under way, then stops
// the limiter's batchers. Later calls are answered by failure mode.
func (l *Limiter) Close() {
	l.life.Lock()
	if l.closed {
		l.life.Unlock()
		return
	}
	l.closed = true
	l.life.Unlock()
	close(l.stop)
	l.swept.Wait()
	l.refunds.Wait()
	l.batchers.Range(func(server, b any) bool {
		b.(*batcher).close()
		l.batchers.Delete(server)
		return true
	})
	l.router.close()
}

// failureVerdicts answers every hit by its failure mode.
func failureVerdicts(hits []Hit) []Verdict {
	verdicts := make([]Verdict, len(hits))
	for i, h := range hits {
		verdicts[i] = failureVerdict(h)
	}
	return verdicts
}

// failureVerdict answers an admissible hit by its failure mode. An allowed
// hit reports its whole limit (a GCRA bucket: its size) as remaining: the
// store could not say, and 0 would tell clients to back off for nothing. A
// hit that defers to Envoy (FailureDefer) is answered as allowed here, so
// that across cluster slots the charges of the other slots stay (errors go
// towards denying); the caller turns it into an error for Envoy's own
// failure mode.
func failureVerdict(h Hit) Verdict {
	if h.FailureMode == config.FailureDeny && !h.givesBack() { // a refund never denies
		return Verdict{FailureVerdict: true, ResetAfter: FailureRetry}
	}
	return Verdict{FailureVerdict: true, Admitted: true, Remaining: uint64(h.capacity())}
}

func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
