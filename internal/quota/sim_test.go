package quota

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// The simulator searches schedules for a decision past a limit. One seed
// makes one schedule: the rule (algorithm, limit, window, burst), how many
// instances decide it, and a list of events -- hits at an instance, refunds
// (Envoy's is_negative_hits), the clock moving, the gathered leases of an
// instance sent with other events run between their store write and its
// answer, an admin Reset, a reload that changes the limit, a store reply
// lost after its write applied, a failover that loses the last
// acknowledged writes (a lagging replica promoted) and a restart without
// persistence. (An instance's wall clock stepping is not one: Slices
// measure time from time.Now, whose monotonic reading a step leaves alone.) The instances are the real Slices over the
// real limiter and Lua, on one miniredis whose clock (Redis TIME) the
// simulator owns; leases and ticks run when the schedule says, on the
// simulator's goroutine, so a seed replays exactly.
//
// The oracle keeps what was admitted and what refunds gave back (a refund
// cancels the newest admitted units of its counter's window: the log's and
// GCRA's sliding window, the counters' current window) and checks after
// every admission the algorithm's bound: the log and the fixed window the
// limit, GCRA burst plus the limit in any window of the limit's length, the
// sliding counter its own estimate. A Reset or a restart starts the count
// afresh. A failover may add what it lost: the units the lost writes
// charged (simFault). The first violation stops the schedule; the test
// prints its seed and the schedule shrunk to the events it needs.
//
// make test runs a bounded slice of seeds (TestSimulator, simSlice per
// algorithm); make sim searches for SIM_FOR per algorithm, the four side
// by side; one seed replays with its trace:
//
//	go test -run '^TestSimulator$' ./internal/quota -sim.for 10m -v
//	go test -run '^TestSimulator$/gcra' ./internal/quota -sim.seed 1234 -v
var (
	simSeed = flag.Uint64("sim.seed", 0, "replay the schedule of this seed only, and print it")
	simFor  = flag.Duration("sim.for", 0, "search schedules for this long per algorithm (make sim); 0: make test's bounded slice")
	simFrom = flag.Uint64("sim.from", 1, "the first seed searched")
)

// simEpoch is a whole number of every window the simulator draws, so that
// fixed windows start with it.
var simEpoch = time.Unix(1_800_000_000, 0)

type simOpKind uint8

const (
	simHit       simOpKind = iota // a request of n units at inst
	simRefund                     // a refund of up to n units at inst
	simAdvance                    // the clock moves d
	simLeases                     // inst's gathered leases go, the next n events between write and answer
	simReset                      // admin Reset at inst
	simReloadOp                   // the limit becomes n
	simLoseReply                  // the next store call's reply is lost after its write applied
	simFailover                   // a replica n calls behind is promoted
	simRestart                    // the store restarts empty
	simEnvoy                      // n requests at Envoy inst, decided by its RLQS token bucket
)

type simOp struct {
	kind simOpKind
	inst int
	n    uint64
	d    time.Duration
}

func (o simOp) String() string {
	switch o.kind {
	case simHit:
		return fmt.Sprintf("hit(i%d, %d)", o.inst, o.n)
	case simRefund:
		return fmt.Sprintf("refund(i%d, %d)", o.inst, o.n)
	case simAdvance:
		return fmt.Sprintf("advance(%v)", o.d)
	case simLeases:
		return fmt.Sprintf("leases(i%d, during %d)", o.inst, o.n)
	case simReset:
		return fmt.Sprintf("reset(i%d)", o.inst)
	case simReloadOp:
		return fmt.Sprintf("reload(limit %d)", o.n)
	case simLoseReply:
		return "lose-reply"
	case simFailover:
		return fmt.Sprintf("failover(lose %d)", o.n)
	case simRestart:
		return "restart"
	case simEnvoy:
		return fmt.Sprintf("envoy(e%d, %d)", o.inst, o.n)
	}
	return "?"
}

// simRule is a schedule's rule and fleet.
type simRule struct {
	alg       config.Algorithm
	limit     uint32
	burst     uint32
	window    time.Duration
	instances int
	envoys    int // Envoys whose RLQS buckets lease from the counter, reporting every 5 s
}

type simSchedule struct {
	seed uint64
	rule simRule
	ops  []simOp
}

var simAlgorithms = []config.Algorithm{config.SlidingWindowLog, config.FixedWindow, config.SlidingWindowCounter, config.GCRA}

// newSimSchedule draws seed's schedule of alg.
func newSimSchedule(seed uint64, alg config.Algorithm) simSchedule {
	rng := rand.New(rand.NewPCG(seed, uint64(alg)))
	r := simRule{
		alg:       alg,
		limit:     []uint32{8, 12, 20, 40}[rng.IntN(4)],
		window:    []time.Duration{2 * time.Second, 5 * time.Second, 10 * time.Second}[rng.IntN(3)],
		instances: 1 + rng.IntN(3),
		envoys:    max(0, rng.IntN(4)-1),
	}
	if r.envoys > 0 {
		// RLQS suits windows longer than its lease (docs/rlqs.md): on a
		// shorter one the counter forgets a lease before its refills.
		r.window = []time.Duration{15 * time.Second, 30 * time.Second, time.Minute}[rng.IntN(3)]
	}
	if alg == config.GCRA && rng.IntN(2) == 0 {
		r.burst = r.limit / 2
	}
	// Demand from half to three times the limit's rate.
	mean := time.Duration(float64(r.window) / float64(r.limit) / (0.5 + 2.5*rng.Float64()))
	ops := make([]simOp, 0, 400)
	for len(ops) < 300 {
		inst := rng.IntN(r.instances)
		switch p := rng.IntN(1000); {
		case p < 560 && r.envoys > 0 && rng.IntN(3) == 0:
			ops = append(ops, simOp{kind: simEnvoy, inst: rng.IntN(r.envoys), n: 1 + uint64(rng.IntN(3))})
			ops = append(ops, simOp{kind: simAdvance, d: time.Duration(rng.ExpFloat64() * float64(mean)).Round(time.Millisecond)})
		case p < 560:
			ops = append(ops, simOp{kind: simHit, inst: inst, n: 1 + uint64(rng.IntN(8)/6)})
			ops = append(ops, simOp{kind: simAdvance, d: time.Duration(rng.ExpFloat64() * float64(mean)).Round(time.Millisecond)})
		case p < 680:
			ops = append(ops, simOp{kind: simRefund, inst: inst, n: 1 + uint64(rng.IntN(3))})
		case p < 800:
			ops = append(ops, simOp{kind: simLeases, inst: inst, n: uint64(rng.IntN(4))})
		case p < 840:
			ops = append(ops, simOp{kind: simAdvance, d: time.Duration(rng.Int64N(int64(r.window)))})
		case p < 860:
			ops = append(ops, simOp{kind: simReset, inst: inst})
		case p < 875:
			ops = append(ops, simOp{kind: simReloadOp, n: uint64([]uint32{8, 12, 20, 40}[rng.IntN(4)])})
		case p < 940:
			ops = append(ops, simOp{kind: simLoseReply})
		case p < 980:
			ops = append(ops, simOp{kind: simFailover, n: 1 + uint64(rng.IntN(3))})
		default:
			ops = append(ops, simOp{kind: simRestart})
		}
	}
	return simSchedule{seed: seed, rule: r, ops: ops}
}

// simStore is the store the instances share: a miniredis, its client and
// limiter, reused across schedules (flushed between them).
type simStore struct {
	m   *miniredis.Miniredis
	lim *limiter.Limiter
}

func newSimStore(t *testing.T) *simStore {
	t.Helper()
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	lim := limiter.New(client, &limiter.Options{Timeout: 10 * time.Second, DenyCache: -1})
	t.Cleanup(lim.Close)
	return &simStore{m: m, lim: lim}
}

// simKey is one key of a store snapshot.
type simKey struct {
	name, str string
	members   map[string]float64
	fields    map[string]string
	expires   time.Time // zero: none
}

// snapshot is the store's content at now.
func (st *simStore) snapshot(now time.Time) []simKey {
	var keys []simKey
	for _, name := range st.m.Keys() {
		k := simKey{name: name}
		switch st.m.Type(name) {
		case "string":
			k.str, _ = st.m.Get(name)
		case "zset":
			members, _ := st.m.ZMembers(name)
			k.members = make(map[string]float64, len(members))
			for _, mem := range members {
				k.members[mem], _ = st.m.ZScore(name, mem)
			}
		case "hash":
			fields, _ := st.m.HKeys(name)
			k.fields = make(map[string]string, len(fields))
			for _, f := range fields {
				k.fields[f] = st.m.HGet(name, f)
			}
		default:
			panic("simulator: a key of type " + st.m.Type(name))
		}
		if ttl := st.m.TTL(name); ttl > 0 {
			k.expires = now.Add(ttl)
		}
		keys = append(keys, k)
	}
	return keys
}

// restore makes the store hold keys at now, less those expired since.
func (st *simStore) restore(keys []simKey, now time.Time) {
	st.m.FlushAll()
	for _, k := range keys {
		if !k.expires.IsZero() && !k.expires.After(now) {
			continue
		}
		switch {
		case k.members != nil:
			for mem, score := range k.members {
				_, _ = st.m.ZAdd(k.name, score, mem)
			}
		case k.fields != nil:
			for f, v := range k.fields {
				st.m.HSet(k.name, f, v)
			}
		default:
			_ = st.m.Set(k.name, k.str)
		}
		if !k.expires.IsZero() {
			st.m.SetTTL(k.name, k.expires.Sub(now))
		}
	}
}

// simWrite is a store call acknowledged: the store after it, and the units
// it charged (what a failover that loses it may add).
type simWrite struct {
	keys    []simKey
	charged uint64
}

// simAdmission is units the fleet admitted at an instant.
type simAdmission struct {
	at              time.Time
	units, refunded uint64
}

// simFault is what a failover lost, at an instant.
type simFault struct {
	at    time.Time
	units uint64
}

// simReload is a reload of the limit: the windows that hold it are bound by
// the larger of the two limits.
type simReload struct {
	at   time.Time
	from uint32
}

var errSimLost = errors.New("simulator: the reply was lost")

// simRun runs one schedule.
type simRun struct {
	st     *simStore
	rule   simRule
	limit  uint32
	now    time.Time // Redis TIME, the truth
	slices []*Slices
	alloc  *Allocator
	envoys []*simEnvoyBucket
	gather []func() // an instance's gathered leases, waiting to be sent
	due    []time.Time

	ops  []simOp
	next int // the next op to run

	writes    []simWrite // the last few acknowledged calls, the oldest first; writes[0] is the base
	applied   bool       // the last store call applied, its reply lost or not
	loseReply bool
	during    []simOp // run between the next lease's write and its answer

	admitted  []simAdmission
	since     int // the first admission after the last Reset or restart: the count starts again
	faults    []simFault
	reloads   []simReload
	trace     []string // what happened, for a failing schedule
	local     int      // hits decided from a slice
	leased    uint64   // units leased
	leases    int      // leases sent to the store
	byBuckets uint64   // units Envoys' RLQS buckets admitted
}

const simKeyName = "{sim}:k"

func (r *simRun) hit(cost uint64) limiter.Hit {
	return limiter.Hit{Key: simKeyName, Algorithm: r.rule.alg, Limit: r.limit, Window: r.rule.window, Burst: r.rule.burst, Cost: cost}
}

// simLedger is the instances' ledger: the real Split, with the store's
// faults and the events run while a lease's answer is on its way.
type simLedger struct {
	r     *simRun
	split *limiter.Split
}

func (l simLedger) Decide(ctx context.Context, hits []limiter.Hit) ([]limiter.Verdict, error) {
	for _, s := range l.r.slices {
		if ctx == s.ctx {
			l.r.leases++
		}
	}
	v, err := l.split.Decide(ctx, hits)
	var charged uint64
	for i := range v {
		if v[i].Charged && !hits[i].Refund {
			charged += hits[i].Cost
		}
	}
	if err = l.r.acknowledge(charged, err); err != nil {
		// Answered as the limiter answers a store failure: by the
		// failure mode (deny), a refund admitted.
		for i := range hits {
			v[i] = limiter.Verdict{FailureVerdict: true, Admitted: hits[i].Refund, ResetAfter: limiter.FailureRetry}
		}
		return v, err
	}
	if during := l.r.during; during != nil {
		l.r.during = nil
		for _, o := range during {
			l.r.apply(o)
		}
	}
	return v, nil
}

func (l simLedger) Share(ctx context.Context, req limiter.ShareRequest) (limiter.Share, error) {
	sh, err := l.split.Share(ctx, req)
	if err = l.r.acknowledge(0, err); err != nil {
		return limiter.Share{}, err
	}
	return sh, nil
}

func (l simLedger) ConfirmShare(ctx context.Context, key, member string, window time.Duration, tokens uint64) error {
	return l.r.acknowledge(0, l.split.ConfirmShare(ctx, key, member, window, tokens))
}

func (l simLedger) GiveBack(ctx context.Context, returns []limiter.Return) (uint64, error) {
	n, err := l.split.GiveBack(ctx, returns)
	if err = l.r.acknowledge(0, err); err != nil {
		return 0, err
	}
	return n, nil
}

func (l simLedger) Reset(ctx context.Context, h limiter.Hit) (int64, error) {
	n, err := l.split.Reset(ctx, h)
	if err = l.r.acknowledge(0, err); err != nil {
		return 0, err
	}
	return n, nil
}

// acknowledge records a store call that applied: a replica's history, and
// the lost reply the schedule asked for.
func (r *simRun) acknowledge(charged uint64, err error) error {
	if err != nil {
		return err
	}
	r.applied = true
	r.writes = append(r.writes, simWrite{keys: r.st.snapshot(r.now), charged: charged})
	if len(r.writes) > 8 {
		r.writes = slices.Delete(r.writes, 0, len(r.writes)-8)
	}
	if r.loseReply {
		r.loseReply = false
		r.trace = append(r.trace, "  the reply was lost")
		return errSimLost
	}
	return nil
}

func newSimRun(st *simStore, s simSchedule) *simRun {
	st.m.FlushAll()
	st.m.SetTime(simEpoch)
	r := &simRun{st: st, rule: s.rule, limit: s.rule.limit, now: simEpoch, ops: s.ops}
	r.writes = []simWrite{{}}
	for i := range s.rule.instances {
		opts := &SliceOptions{Threshold: 2, Now: func() time.Time { return r.now }, Observe: SliceObserver{
			Local:  func(n int) { r.local += n },
			Leased: func(n uint64) { r.leased += n },
		}}
		sl := newSlices(simLedger{r: r, split: limiter.NewSplit(st.lim, nil)}, opts, false)
		sl.later = func(d time.Duration, f func()) {
			r.gather[i], r.due[i] = f, r.now.Add(d)
		}
		sl.spawn = func(f func()) { f() }
		r.slices = append(r.slices, sl)
		r.gather = append(r.gather, nil)
		r.due = append(r.due, time.Time{})
	}
	r.alloc = New(simLedger{r: r, split: limiter.NewSplit(st.lim, nil)}, &Options{Now: func() time.Time { return r.now }})
	for i := range s.rule.envoys {
		r.envoys = append(r.envoys, &simEnvoyBucket{lease: Bucket{Member: fmt.Sprint("envoy-", i)}, seen: 1})
	}
	for _, e := range r.envoys {
		r.report(e)
	}
	return r
}

// simEnvoyBucket is one Envoy's RLQS bucket as Envoy runs it: a token
// bucket refilled continuously, capped, starting full when its assignment
// changes; denying once its assignment expired (the bucket's expired
// assignment behavior, deny).
type simEnvoyBucket struct {
	lease    Bucket
	held     Assignment
	received time.Time
	tokens   float64
	refilled time.Time
	seen     uint64 // requests since the last report
	buckets  []simBucketLife
}

// simBucketLife is a token bucket an Envoy started: its first fill is the
// published bound's own term (docs/rlqs.md), counted while it lives and a
// window after.
type simBucketLife struct {
	end   time.Time // zero: live
	first uint64
}

// envoyServe lets n requests through Envoy e's bucket now.
func (r *simRun) envoyServe(e *simEnvoyBucket, n uint64) uint64 {
	live := e.held.Kind == TokenBucket && r.now.Before(e.received.Add(e.held.TTL))
	if live {
		rate := float64(e.held.TokensPerFill) / e.held.FillInterval.Seconds()
		e.tokens = min(float64(e.held.MaxTokens), e.tokens+rate*r.now.Sub(e.refilled).Seconds())
	}
	e.refilled = r.now
	var admitted uint64
	for range n {
		e.seen++
		if live && e.tokens >= 1 {
			e.tokens--
			admitted++
		}
	}
	return admitted
}

// report sends Envoy e's report to the allocator and applies the answer.
func (r *simRun) report(e *simEnvoyBucket) {
	lim := Limit{Hits: []limiter.Hit{r.hit(0)}, ShareKey: simKeyName + ":rlqs"}
	a, err := r.alloc.Report(context.Background(), &e.lease, lim, e.seen)
	if err != nil {
		return // the held assignment runs out at its time to live
	}
	r.trace = append(r.trace, fmt.Sprintf("  report: %+v", a))
	e.seen = 0
	r.envoyServe(e, 0) // refilled up to now under the old assignment
	if a.Kind == TokenBucket && (e.held.Kind != TokenBucket || e.held.MaxTokens != a.MaxTokens ||
		e.held.TokensPerFill != a.TokensPerFill || e.held.FillInterval != a.FillInterval ||
		!r.now.Before(e.received.Add(e.held.TTL))) {
		e.tokens = float64(a.MaxTokens)
		e.endBucket(r.now)
		e.buckets = append(e.buckets, simBucketLife{first: a.MaxTokens})
	} else if a.Kind != TokenBucket {
		e.endBucket(r.now)
	}
	e.held, e.received = a, r.now
	_ = r.alloc.Confirm(context.Background(), &e.lease, lim)
}

func (e *simEnvoyBucket) endBucket(now time.Time) {
	if n := len(e.buckets); n > 0 && e.buckets[n-1].end.IsZero() {
		e.buckets[n-1].end = now
	}
}

// close drops the instances without giving back: the next schedule
// flushes the store.
func (r *simRun) close() {
	for _, s := range r.slices {
		s.closed.Store(true)
		s.cancel()
	}
}

// run runs the schedule to its end or its first violation.
func (r *simRun) run() (violation string) {
	defer r.close()
	for r.next < len(r.ops) {
		o := r.ops[r.next]
		r.next++
		if o.kind == simLeases {
			n := min(int(o.n), len(r.ops)-r.next)
			r.during = r.ops[r.next : r.next+n]
			r.next += n
		}
		if v := r.apply(o); v != "" {
			return v
		}
	}
	return ""
}

// apply runs one event; it returns the violation it caused, if any.
func (r *simRun) apply(o simOp) string {
	r.trace = append(r.trace, fmt.Sprintf("%6.3fs %v", r.now.Sub(simEpoch).Seconds(), o))
	ctx := context.Background()
	switch o.kind {
	case simHit:
		v, err := r.slices[o.inst].Decide(ctx, []limiter.Hit{r.hit(o.n)})
		if err == nil && v[0].Admitted && !v[0].FailureVerdict {
			r.trace = append(r.trace, fmt.Sprintf("  admitted, remaining %d", v[0].Remaining))
			return r.admit(o.n)
		}
	case simRefund:
		// A client refunds only units it was admitted: at most what the
		// oracle holds uncancelled in the window the refund reaches.
		n := min(o.n, r.refundable())
		if n == 0 {
			return ""
		}
		h := r.hit(n)
		h.Refund = true
		r.applied = false
		_, _ = r.slices[o.inst].Decide(ctx, []limiter.Hit{h})
		if r.applied { // its reply lost or not
			r.cancel(n)
		}
	case simEnvoy:
		if n := r.envoyServe(r.envoys[o.inst], o.n); n > 0 {
			r.byBuckets += n
			r.trace = append(r.trace, fmt.Sprintf("  %d admitted by its bucket", n))
			return r.admit(n)
		}
	case simAdvance:
		r.advance(o.d)
	case simLeases:
		r.sendLeases(o.inst)
		r.during = nil
	case simReset:
		// Other instances' slices live on: the log keeps their members
		// (recorded ahead), the other algorithms' counts forget them, and
		// each unit they held is then spent or given back uncounted.
		// The Envoys' leases go with the count.
		held := r.leasedAhead()
		if r.rule.alg != config.SlidingWindowLog {
			held += r.held(o.inst)
		}
		r.applied = false
		_, _ = r.slices[o.inst].Reset(ctx, r.hit(0))
		if r.applied { // its reply lost or not
			r.since = len(r.admitted)
			r.faults = append(r.faults, simFault{at: r.now, units: held})
		}
	case simReloadOp:
		r.reloads = append(r.reloads, simReload{at: r.now, from: r.limit})
		r.limit = uint32(o.n)
	case simLoseReply:
		r.loseReply = true
	case simFailover:
		n := min(int(o.n), len(r.writes)-1)
		var lost uint64
		for _, w := range r.writes[len(r.writes)-n:] {
			lost += w.charged
		}
		r.writes = r.writes[:len(r.writes)-n]
		r.st.restore(r.writes[len(r.writes)-1].keys, r.now)
		r.faults = append(r.faults, simFault{at: r.now, units: lost})
	case simRestart:
		r.st.m.FlushAll()
		r.writes = []simWrite{{}}
		r.since = len(r.admitted)
		// The live slices' units are still spent, and no longer counted.
		r.faults = append(r.faults, simFault{at: r.now, units: r.held(-1) + r.leasedAhead()})
	}
	return ""
}

// leasedAhead is the refills the Envoys' buckets were leased ahead.
func (r *simRun) leasedAhead() uint64 {
	var n uint64
	for _, e := range r.envoys {
		if b := &e.lease; b.held.Kind == TokenBucket && b.leaseEnd.After(r.now) {
			rate := float64(b.held.TokensPerFill) / b.held.FillInterval.Seconds()
			n += uint64(math.Ceil(rate*b.leaseEnd.Sub(r.now).Seconds()+b.carry)) + 1
		}
	}
	return n
}

// held is the units the slices of every instance but except hold: live,
// or ended and waiting for the next tick to be given back.
func (r *simRun) held(except int) uint64 {
	var n uint64
	for i, s := range r.slices {
		if i == except {
			continue
		}
		s.each(func(k *hotKey) { n += k.available(r.now) })
		for _, ret := range s.returns {
			n += ret.Units
		}
	}
	return n
}

// sendLeases sends inst's gathered leases, if any.
func (r *simRun) sendLeases(inst int) {
	if f := r.gather[inst]; f != nil {
		r.gather[inst] = nil
		f()
	}
}

// advance moves the clock d: every instance ticks at each whole second it
// passes, and leases whose gathering ended go.
func (r *simRun) advance(d time.Duration) {
	end := r.now.Add(d)
	for {
		next := r.now.Truncate(time.Second).Add(time.Second)
		for i := range r.due {
			if r.gather[i] != nil && r.due[i].Before(next) && !r.due[i].After(end) {
				next = r.due[i]
			}
		}
		if next.After(end) {
			break
		}
		r.setNow(next)
		for i := range r.gather {
			if r.gather[i] != nil && !r.due[i].After(r.now) {
				r.sendLeases(i)
			}
		}
		if r.now.Truncate(time.Second).Equal(r.now) {
			for _, s := range r.slices {
				s.turn(r.now)
				s.flush()
			}
		}
		if r.now.Truncate(DefaultReportInterval).Equal(r.now) {
			for _, e := range r.envoys {
				r.report(e)
			}
		}
	}
	r.setNow(end)
}

func (r *simRun) setNow(t time.Time) {
	r.now = t
	r.st.m.SetTime(t)
}

// inWindow reports whether an admission at at counts in the window the
// oracle checks at now: the log's and GCRA's sliding window, the counters'
// current window.
func (r *simRun) inWindow(i int) bool {
	if i < r.since {
		return false
	}
	at := r.admitted[i].at
	w := r.rule.window
	switch r.rule.alg {
	case config.FixedWindow, config.SlidingWindowCounter:
		return at.Sub(simEpoch)/w == r.now.Sub(simEpoch)/w
	}
	return at.After(r.now.Add(-w))
}

func (r *simRun) refundable() uint64 {
	var n uint64
	for i, a := range r.admitted {
		if r.inWindow(i) {
			n += a.units - a.refunded
		}
	}
	return n
}

// cancel takes n refunded units off the newest admissions in the window.
func (r *simRun) cancel(n uint64) {
	for i := len(r.admitted) - 1; i >= 0 && n > 0; i-- {
		a := &r.admitted[i]
		if !r.inWindow(i) {
			break
		}
		back := min(n, a.units-a.refunded)
		a.refunded += back
		n -= back
	}
}

// admit records n units admitted now and checks the algorithm's bound.
func (r *simRun) admit(n uint64) string {
	r.admitted = append(r.admitted, simAdmission{at: r.now, units: n})
	w := r.rule.window
	// A fault's units count while a window can hold them: a slice ends
	// within its window or a period after it, and the sliding counter
	// weighs its previous window in.
	reach := w + time.Second
	if r.rule.alg == config.SlidingWindowCounter {
		reach += w
	}
	// Across a reload, a count holds the larger limit; a GCRA bucket, whose
	// TAT the new rate reads, the two rules' bounds together.
	limit, reloaded := r.limit, uint64(0)
	for _, l := range r.reloads {
		if l.at.After(r.now.Add(-2 * w)) {
			limit = max(limit, l.from)
			reloaded += uint64(bucket(r.rule.burst, l.from)) + uint64(l.from)
		}
	}
	var slack uint64
	for _, f := range r.faults {
		if f.at.After(r.now.Add(-reach)) {
			slack += f.units
		}
	}
	// Each token bucket an Envoy held in the window lets its fill through
	// unleased (docs/rlqs.md, "The bound"); on a fixed window, a lease made
	// before the window's edge counts in the old window only, while its
	// refills come in the new one.
	if len(r.envoys) > 0 && r.rule.alg == config.FixedWindow {
		slack += uint64(math.Ceil(float64(limit) * (DefaultLease + deliveryMargin).Seconds() / w.Seconds()))
	}
	for _, e := range r.envoys {
		for _, b := range e.buckets {
			if b.end.IsZero() || b.end.After(r.now.Add(-reach)) {
				slack += b.first
			}
		}
	}
	count := r.refundable() // what the window holds, less refunds
	switch r.rule.alg {
	case config.SlidingWindowLog, config.FixedWindow:
		if count > uint64(limit)+slack {
			return fmt.Sprintf("%d units in the window, limit %d (+%d lost)", count, limit, slack)
		}
	case config.GCRA:
		bound := uint64(bucket(r.rule.burst, r.limit)) + uint64(r.limit) + reloaded
		if count > bound+slack {
			return fmt.Sprintf("%d units in a window, burst + limit %d (+%d lost)", count, bound, slack)
		}
	case config.SlidingWindowCounter:
		// Its own estimate: the previous window weighed by what the
		// sliding window still covers of it, plus the current one.
		idx := r.now.Sub(simEpoch) / w
		var prev uint64
		for _, a := range r.admitted[r.since:] {
			if a.at.Sub(simEpoch)/w == idx-1 {
				prev += a.units - a.refunded
			}
		}
		elapsed := r.now.Sub(simEpoch) - idx*w
		est := float64(prev)*float64(w-elapsed)/float64(w) + float64(count)
		if est > float64(uint64(limit)+slack)+1e-9 {
			return fmt.Sprintf("estimate %.3f (previous %d, current %d), limit %d (+%d lost)", est, prev, count, limit, slack)
		}
	}
	return ""
}

// bucket is a GCRA rule's bucket size: its burst, 0 meaning the limit.
func bucket(burst, limit uint32) uint32 {
	if burst == 0 {
		return limit
	}
	return burst
}

// simulate runs s on st; it returns the violation and the run.
func simulate(st *simStore, s simSchedule) (string, *simRun) {
	r := newSimRun(st, s)
	return r.run(), r
}

// shrink removes events from a failing schedule while it still fails,
// within budget replays.
func shrink(st *simStore, s simSchedule, budget int) simSchedule {
	fails := func(ops []simOp) bool {
		budget--
		v, _ := simulate(st, simSchedule{seed: s.seed, rule: s.rule, ops: ops})
		return v != ""
	}
	ops := s.ops
	for chunk := len(ops) / 2; chunk >= 1 && budget > 0; chunk /= 2 {
		for i := 0; i+chunk <= len(ops) && budget > 0; {
			try := slices.Concat(ops[:i], ops[i+chunk:])
			if fails(try) {
				ops = try
			} else {
				i += chunk
			}
		}
	}
	s.ops = ops
	return s
}

func (s simSchedule) describe(st *simStore) string {
	v, r := simulate(st, s)
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %v limit %d burst %d window %v, %d instances, %d Envoys, %d events: %s\n",
		s.seed, s.rule.alg, s.rule.limit, s.rule.burst, s.rule.window, s.rule.instances, s.rule.envoys, len(s.ops), v)
	for _, line := range r.trace {
		b.WriteString(line + "\n")
	}
	return b.String()
}

// simSlice is how many seeds per algorithm make test searches.
const simSlice = 12

// TestSimulator searches schedules of every algorithm for a decision past
// its bound (see the simulator's comment above); on one, it prints the
// seed, and the schedule shrunk, to replay with -sim.seed.
func TestSimulator(t *testing.T) {
	for _, alg := range simAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			st := newSimStore(t)
			if *simSeed != 0 {
				s := newSimSchedule(*simSeed, alg)
				v, _ := simulate(st, s)
				t.Log(s.describe(st))
				if v != "" {
					t.Fatalf("seed %d: %s", *simSeed, v)
				}
				return
			}
			start := time.Now()
			seed, n, local, leased, byBuckets := *simFrom, 0, 0, uint64(0), uint64(0)
			for ; *simFor > 0 && time.Since(start) < *simFor || *simFor == 0 && n < simSlice; seed++ {
				n++
				s := newSimSchedule(seed, alg)
				v, r := simulate(st, s)
				local, leased, byBuckets = local+r.local, leased+r.leased, byBuckets+r.byBuckets
				if v != "" {
					t.Fatalf("seed %d (-sim.seed %d): %s; shrunk:\n%s", seed, seed, v, shrink(st, s, 300).describe(st))
				}
			}
			t.Logf("%d schedules (seeds %d to %d) in %v, none past its bound; %d hits decided from slices, %d units leased; %d admitted by RLQS buckets",
				n, *simFrom, seed-1, time.Since(start).Round(time.Millisecond), local, leased, byBuckets)
		})
	}
}

// TestSimulatorCases replays schedules written by hand, each one a way
// past the limit the simulator's search found or that a review saw: each
// admitted more than its bound before the fix its name gives.
func TestSimulatorCases(t *testing.T) {
	hits := func(inst, n int) []simOp {
		ops := make([]simOp, n)
		for i := range ops {
			ops[i] = simOp{kind: simHit, inst: inst, n: 1}
		}
		return ops
	}
	at := func(d time.Duration) simOp { return simOp{kind: simAdvance, d: d} }
	for _, tc := range []struct {
		name string
		rule simRule
		ops  []simOp
	}{{
		// The log's refund took the newest members: a live slice's,
		// recorded at its period's end, which its instance still spent.
		name: "log/refund leaves a live slice's members",
		rule: simRule{alg: config.SlidingWindowLog, limit: 40, window: 10 * time.Second, instances: 2},
		ops: slices.Concat(hits(0, 2), []simOp{{kind: simLeases, inst: 0}, at(100 * time.Millisecond)}, hits(1, 1),
			[]simOp{{kind: simRefund, inst: 1, n: 1}, at(100 * time.Millisecond)}, hits(0, 4),
			[]simOp{at(9950 * time.Millisecond)}, hits(1, 40)),
	}, {
		// An admin Reset on one instance deleted the log's members of
		// another instance's live slice.
		name: "log/reset keeps another instance's slice",
		rule: simRule{alg: config.SlidingWindowLog, limit: 40, window: 10 * time.Second, instances: 2},
		ops: slices.Concat(hits(0, 2), []simOp{{kind: simLeases, inst: 0}, at(100 * time.Millisecond),
			{kind: simReset, inst: 1}}, hits(0, 4), hits(1, 40)),
	}, {
		// A Reset while the instance's own lease was on its way: the
		// lease's answer installed a slice of the counter just deleted.
		name: "fixed_window/reset during a lease",
		rule: simRule{alg: config.FixedWindow, limit: 40, window: 10 * time.Second, instances: 1},
		ops:  slices.Concat(hits(0, 2), []simOp{{kind: simLeases, inst: 0, n: 1}, {kind: simReset, inst: 0}}, hits(0, 44)),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			st := newSimStore(t)
			s := simSchedule{rule: tc.rule, ops: tc.ops}
			v, r := simulate(st, s)
			if v != "" {
				t.Fatalf("%s\n%s", v, s.describe(st))
			}
			if r.leases == 0 {
				t.Fatalf("no lease: the case tests nothing\n%s", s.describe(st))
			}
		})
	}
}
