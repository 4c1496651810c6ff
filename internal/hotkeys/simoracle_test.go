package hotkeys

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
)

// The simulator's oracle (see sim_test.go): what was admitted and refunded,
// what faults and reloads allow past the limit, and each algorithm's bound
// checked at every admission; and for the log and the fixed window, at
// every denial, that the store held what it denied for.

// simAdmission is units the fleet admitted at an instant.
type simAdmission struct {
	at              time.Time
	units, refunded uint64
	// from is what admitted them: the store (simByStore: on the log,
	// members named by their score, which a refund at the store takes), a
	// slice or an Envoy's RLQS bucket (out of a lease, whose members no
	// refund at the store takes).
	from simSource
	// part: charged as a request's part (on two stores, or two Cluster
	// slots). The log names such a charge's members after its score and a
	// nonce, which sort after a plain charge's name at that score.
	part bool
	// score is the log's score of the members the store recorded, in
	// microseconds (simRun.logScore): a refund at the store takes the
	// newest by score, and at one score a part's first (by its name).
	score int64
}

type simSource uint8

const (
	simByStore simSource = iota
	simBySlice
	simByBucket
)

// simSeat is a lease a seats rule's acquisition took: its units count
// until it is settled or its time to live ends.
type simSeat struct {
	id      string
	units   uint64
	ends    time.Time
	settled bool
}

// simFault is what a failover lost, at an instant.
type simFault struct {
	at    time.Time
	units uint64
	spent []*slice // lost leases' live slices: the units they spend count too
}

// simReload is a reload of the limit: the windows that hold it are bound by
// the larger of the two limits.
type simReload struct {
	at   time.Time
	from uint32
}

// semantics is the algorithm whose bound the rule's is: the reference's
// fixed window counts as fixed_window does, at keys of its own.
func (r *simRun) semantics() config.Algorithm {
	if r.rule.alg == config.ReferenceFixedWindow {
		return config.FixedWindow
	}
	return r.rule.alg
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
	switch r.semantics() {
	case config.FixedWindow, config.SlidingWindowCounter:
		return at.Sub(simEpoch)/w == r.now.Sub(simEpoch)/w
	}
	return at.After(r.now.Add(-w))
}

// refundable is what a client may refund: the units admitted in the
// window, less those refunded, but a charge whose request is not answered
// yet (no client knows of it).
func (r *simRun) refundable() uint64 {
	var n uint64
	for i, a := range r.admitted {
		if r.inWindow(i) && i != r.pending {
			n += a.units - a.refunded
		}
	}
	return n
}

// cancel takes n units a refund took off the newest admissions in the
// window, and returns what it found no admission for. A refund names no
// charge: one at the store (from simByStore) takes only what the store
// admitted itself, never a slice's nor a lease's units (on the log its
// members; on the counters the units the slices' records hold); one given
// back to an instance's slices (simBySlice), to spend again, the units
// they spent. The log's takes the newest by the store's score
// (simAdmission.score), a charge whose request is not answered yet among
// them (whose give-back then finds nothing); the counters' take from the
// count, a charge not answered yet last (its give-back takes what is left
// of it). GCRA's takes time, whoever admitted the units, and a charge not
// answered yet keeps its own units, which its give-back takes.
func (r *simRun) cancel(n uint64, from simSource) uint64 {
	var newest []int
	pending := -1
	for i := len(r.admitted) - 1; i >= 0 && r.inWindow(i); i-- {
		switch {
		case r.semantics() != config.GCRA && r.admitted[i].from != from:
			continue
		case i == r.pending && r.semantics() == config.GCRA:
			continue
		case i == r.pending && r.semantics() != config.SlidingWindowLog:
			pending = i
			continue
		}
		newest = append(newest, i)
	}
	if pending >= 0 {
		newest = append(newest, pending)
	}
	if r.semantics() == config.SlidingWindowLog {
		// The log's refund takes the newest members by score, then by name
		// (ZREVRANGEBYSCORE): "<score>p<nonce>" before "<score>", and of
		// two parts the later nonce.
		slices.SortStableFunc(newest, func(i, j int) int {
			a, b := &r.admitted[i], &r.admitted[j]
			if c := cmp.Compare(b.score, a.score); c != 0 {
				return c
			}
			switch {
			case a.part && !b.part:
				return -1
			case b.part && !a.part:
				return 1
			}
			return 0
		})
	}
	for _, i := range newest {
		if n == 0 {
			break
		}
		a := &r.admitted[i]
		back := min(n, a.units-a.refunded)
		a.refunded += back
		n -= back
	}
	return n
}

// admit records n units admitted now, from (see simAdmission), and checks
// the algorithm's bound.
func (r *simRun) admit(n uint64, from simSource, part bool) string {
	r.record(simAdmission{units: n, from: from, part: part})
	return r.check(r.count())
}

// record adds a, charged now, to what was admitted, scored as the log's
// store scores its members.
func (r *simRun) record(a simAdmission) {
	a.at, a.score = r.now, r.logScore(a)
	r.admitted = append(r.admitted, a)
}

// logScore is the score the log's store gives the members of a charge
// made now (sliding_window_log.commit, under a frozen TIME): a part's is
// TIME (its call's only charge of the key: the simulator's calls charge a
// key once), its name unique by its nonce; any other's the first microsecond
// from TIME whose plain name is free, a name live while a charge's first
// member is (a refund takes a charge's first member last). So charges at
// one instant are scored apart, in the order they came, and a refund
// takes the later first.
func (r *simRun) logScore(a simAdmission) int64 {
	score := r.now.UnixMicro()
	if a.part || a.from != simByStore || r.semantics() != config.SlidingWindowLog {
		return score
	}
	// A charge at an instant is scored at most as many microseconds after
	// it as there were charges: older admissions' scores are all below now.
	var taken []int64
	for i := len(r.admitted) - 1; i >= r.since; i-- {
		b := &r.admitted[i]
		if b.at.UnixMicro()+int64(len(r.admitted)) < score {
			break
		}
		if b.from == simByStore && !b.part && b.refunded < b.units && b.score >= score {
			taken = append(taken, b.score)
		}
	}
	for slices.Contains(taken, score) {
		score++
	}
	return score
}

// charged records n units a request's part charged now, before its answer
// (the other part waits on its store): they count from now, and events run
// before the answer see them, as the store does (a refund cancels the
// newest). answered settles them.
func (r *simRun) charged(n uint64) {
	r.pending = len(r.admitted)
	r.record(simAdmission{units: n, part: true})
}

// answered settles the units charged ahead of the answer: an admitted
// request keeps them, and its bound is checked; a denied one's were given
// back (Split's give-back). (A failover meanwhile made them a fault's.)
func (r *simRun) answered(admitted bool) string {
	i := r.pending
	r.pending = -1
	if !admitted {
		a := &r.admitted[i]
		a.refunded = a.units
		return ""
	}
	return r.check(r.count())
}

// count is what the window holds now, less refunds.
func (r *simRun) count() uint64 {
	var n uint64
	for i, a := range r.admitted {
		if r.inWindow(i) {
			n += a.units - a.refunded
		}
	}
	return n
}

// admitSeat checks a seats rule's bound after an acquisition: the seats
// held (acquired since the last Reset, neither settled nor past their time
// to live) and the settled costs in the window within the limit.
func (r *simRun) admitSeat() string {
	count := r.count()
	for _, st := range r.seats[r.seatsFrom:] {
		if !st.settled && st.ends.After(r.now) {
			count += st.units
		}
	}
	return r.check(count)
}

// check checks the algorithm's bound on count, what the window holds
// now, less refunds.
func (r *simRun) check(count uint64) string {
	w := r.rule.window
	// A fault's units count while a window can hold them: a slice ends
	// within its window or a period after it (GCRA's and an RLQS bucket's:
	// see below), and the sliding counter weighs its previous window in.
	reach := w + time.Second
	switch r.semantics() {
	case config.SlidingWindowCounter:
		reach += w
	case config.GCRA:
		// A GCRA slice's units are spent up to their slots, as far ahead
		// of its lease as the bucket was full: a whole bucket's time.
		reach += time.Duration(bucket(r.rule.burst, r.limit)) * w / time.Duration(r.limit)
	}
	if len(r.envoys) > 0 {
		// An Envoy's bucket spends what it was leased up to its lease's end.
		reach += rlqs.DefaultLease + rlqs.AnswerWithin
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
	var slack, debt uint64
	for _, f := range r.faults {
		if f.at.After(r.now.Add(-reach)) {
			slack += f.units
			for _, sl := range f.spent {
				slack += sl.used - sl.returned
			}
		}
	}
	for _, d := range r.debts {
		if d.at.After(r.now.Add(-reach)) {
			debt += d.units
		}
	}
	// Each token bucket an Envoy held in the window lets its fill through
	// unleased (docs/rlqs.md, "The bound"); a lease counts from when it is
	// made, while its refills come up to a lease later: a window that
	// starts after the lease (a fixed window's, the sliding counter's
	// current one) holds refills it does not count. The log records a
	// lease at its end, and GCRA's bucket is a total: what they leased
	// ahead stays counted.
	if len(r.envoys) > 0 && (r.semantics() == config.FixedWindow || r.semantics() == config.SlidingWindowCounter) {
		slack += uint64(math.Ceil(float64(limit) * (rlqs.DefaultLease + rlqs.AnswerWithin).Seconds() / w.Seconds()))
	}
	for _, e := range r.envoys {
		for _, b := range e.buckets {
			if b.end.IsZero() || b.end.After(r.now.Add(-reach)) {
				slack += b.first
			}
		}
	}
	switch r.semantics() {
	case config.SlidingWindowLog, config.FixedWindow:
		if count > uint64(limit)+slack+debt {
			return fmt.Sprintf("%d units in the window, limit %d (+%d lost, +%d recorded past it)", count, limit, slack, debt)
		}
	case config.GCRA:
		bound := uint64(bucket(r.rule.burst, r.limit)) + uint64(r.limit) + reloaded
		if count > bound+slack+debt {
			return fmt.Sprintf("%d units in a window, burst + limit %d (+%d lost, +%d recorded past it)", count, bound, slack, debt)
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
		if est > float64(uint64(limit)+slack+debt)+1e-9 {
			return fmt.Sprintf("estimate %.3f (previous %d, current %d), limit %d (+%d lost, +%d recorded past it)", est, prev, count, limit, slack, debt)
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

// simLease is an Envoy's lease the store charged: units at at, the log's
// members recorded at end.
type simLease struct {
	at, end time.Time
	units   uint64
}

// unsure marks the store as holding, for as long as a window can count it,
// what the oracle does not know of: the charge of a call whose reply was
// lost, a give-back that failed or a failover lost.
func (r *simRun) unsure() {
	reach := r.rule.window + r.rule.window/20 + 2*time.Second
	if len(r.envoys) > 0 {
		reach += rlqs.DefaultLease + rlqs.AnswerWithin
	}
	r.unsureUntil = r.now.Add(reach)
}

// denied checks a denial of n units by the store, for the log and the fixed
// window (whose counts are exact), where nothing the oracle does not know
// of may be held: the store denies only what would pass the limit beside
// what it holds, and what it may hold is the units admitted in the window
// (the log's from a slice are recorded up to a slice's period, a twentieth
// of the window, later than spent), what the slices hold charged and
// unspent (until a tick gives it back) or are being leased, what a log's
// Reset kept of the other instances' live slices (simRun.keptMembers), the
// seats held, and the Envoys' leases still counted (the
// log's until a window after their end, the fixed window's in the window
// they were made). More than that held is a charge nothing takes back: a
// give-back that found nothing, a record that outlives its lease.
func (r *simRun) denied(n uint64) string {
	alg, w := r.semantics(), r.rule.window
	if alg != config.SlidingWindowLog && alg != config.FixedWindow || r.now.Before(r.unsureUntil) {
		return ""
	}
	sameWindow := func(at time.Time) bool { return at.Sub(simEpoch)/w == r.now.Sub(simEpoch)/w }
	inLog := func(at time.Time) bool { return at.After(r.now.Add(-w - w/20)) }
	var held uint64
	for _, a := range r.admitted[r.since:] {
		switch {
		case alg == config.FixedWindow && sameWindow(a.at):
			held += a.units - a.refunded
		case alg == config.SlidingWindowLog && inLog(a.at):
			held += a.units - a.refunded
		}
	}
	for _, k := range r.keptMembers {
		if inLog(k.at) {
			held += k.units
		}
	}
	for _, l := range r.rlqsLeases {
		// A Reset of the log keeps what is named as a lease's or a
		// slice's (their give-backs take it by name); a restart keeps
		// nothing.
		if l.at.Before(r.restartAt) || alg == config.FixedWindow && l.at.Before(r.sinceAt) {
			continue
		}
		if alg == config.FixedWindow && sameWindow(l.at) || alg == config.SlidingWindowLog && l.end.After(r.now.Add(-w)) {
			held += l.units
		}
	}
	for _, st := range r.seats[r.seatsFrom:] {
		if !st.settled && st.ends.After(r.now) {
			held += st.units
		}
	}
	for _, sl := range r.slices {
		// What the slices hold charged: live, ended until a tick gives it
		// back, or being given back.
		sl.each(func(k *hotKey) { held += k.held(r.now) })
		for _, ret := range sl.returns {
			held += ret.Units
		}
	}
	held += r.inflightUnits(-1)
	r.denialsChecked++
	if held+n <= uint64(r.limit) {
		return fmt.Sprintf("%d units denied where the store holds at most %d of the limit %d", n, held, r.limit)
	}
	return ""
}
