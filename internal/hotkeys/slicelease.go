package hotkeys

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// A slice's lease keeps these, whatever the policy (slicepolicy.go) asks:
//
//   - a unit is charged to the counter (by the store's limiter.Decide)
//     before this instance uses it; a lease that does not fit is not made;
//   - a unit is used only while the algorithm's bound allows (slice.expires,
//     GCRA's slots: docs/reliability.md, "Hot keys");
//   - a give back returns only units this instance did not use, by the
//     charge's token, and never a fixed window's that has ended;
//   - a Reset ends the counter's slices at this instance and a lease on its
//     way is not installed (its charge goes back by its token; see Reset).
//
// What a store that forgets writes (a failover, a restart) or a Reset on
// another instance can still add is bounded in docs/accuracy.md.

// recorded is a sliding log's ended slice, whose members (recorded at its
// period's end) may be ahead of Redis's now until until: a Reset keeps the
// members ahead (other instances' live slices) but removes these by name.
type recorded struct {
	all   limiter.Return // every unit of the slice
	until time.Time
}

// slice is units of a counter this instance leased.
type slice struct {
	n, used    uint64
	returned   uint64 // of used, the units given back when it ended
	token      int64
	sent       time.Time     // when its lease was sent
	expires    time.Time     // no unit used from then on: where the algorithm's bound ends it
	lastUse    time.Time     // its lease, or the last hit it decided: idle for idle, it ends
	idle       time.Duration // a hot key's period, a warm key's units' time at its rate
	first      time.Time     // GCRA: unit 0's deadline; unit k's is first + k*interval
	interval   time.Duration // GCRA's emission interval; 0 for other algorithms
	remaining  uint64        // the counter's remaining after the lease
	windowEnd  time.Time     // fixed_window: its window has ended in Redis by then; zero otherwise
	resetAfter time.Duration // the counter's reset after the lease
}

// available is the units k's live slices hold at now.
func (k *hotKey) available(now time.Time) uint64 {
	var n uint64
	for _, sl := range k.slices {
		n += sl.available(now)
	}
	return n
}

// held is the units k's slices hold at now that the counter still counts
// as charged, until a tick gives them back: none of an ended fixed window.
func (k *hotKey) held(now time.Time) uint64 {
	var n uint64
	for _, sl := range k.slices {
		sl.available(now) // GCRA: the units whose slot started are used
		if sl.windowEnd.IsZero() || now.Before(sl.windowEnd) {
			n += sl.n - sl.used
		}
	}
	return n
}

// live reports whether sl may still spend units at now.
func (sl *slice) live(now time.Time) bool {
	return now.Before(sl.expires) && (sl.windowEnd.IsZero() || now.Before(sl.windowEnd)) && sl.returned == 0
}

// spent is the units sl spent that it could spend again at now if given
// back: none once not live, for GCRA only those spent ahead of their slots.
func (sl *slice) spent(now time.Time) uint64 {
	if !sl.live(now) {
		return 0
	}
	sl.available(now)
	if sl.interval > 0 && now.After(sl.first) {
		late := min(uint64((now.Sub(sl.first)+sl.interval-1)/sl.interval), sl.n)
		return sl.used - min(sl.used, late)
	}
	return sl.used
}

// available is the units sl holds at now, dropping GCRA's past their slot.
func (sl *slice) available(now time.Time) uint64 {
	if !now.Before(sl.expires) {
		return 0
	}
	if sl.interval > 0 && now.After(sl.first) {
		// Unit k is usable while now <= first + k*interval.
		late := uint64((now.Sub(sl.first) + sl.interval - 1) / sl.interval)
		sl.used = max(sl.used, min(late, sl.n))
	}
	return sl.n - sl.used
}

// take takes h's cost from k's slices, the oldest first, and answers h as
// Redis would have at the last lease, less what this instance used since
// (see answer; the reset is that of the last slice used).
func (k *hotKey) take(h *limiter.Hit, now time.Time) limiter.Verdict {
	need := h.Cost
	var last *slice
	for _, sl := range k.slices {
		if need == 0 {
			break
		}
		got := min(sl.available(now), need)
		sl.used += got
		need -= got
		if got > 0 {
			last, sl.lastUse = sl, now
		}
	}
	v := limiter.Verdict{Admitted: true, Charged: true, ResetAfter: max(0, last.resetAfter-now.Sub(last.sent))}
	k.storeNewest = false
	k.answer(h, &v, now)
	return v
}

// answer sets v as this instance sees h's counter at now (the caller holds
// k's shard's lock; k has slices): remaining is the newest lease's answer
// (see rebase), which counted every older slice's units as used, plus the
// units the slices still hold or gave back since, this instance's to give.
// For GCRA, whose room grows as the bucket is paid, the reset is the newest
// lease's less the time since and the held units' time at its pace, and
// remaining the bucket less the units owed then, as decide.lua answers.
func (k *hotKey) answer(h *limiter.Hit, v *limiter.Verdict, now time.Time) {
	newest := k.slices[len(k.slices)-1]
	left := k.held(now)
	v.Remaining = min(newest.remaining+left+k.unlanded+k.landed, uint64(h.Capacity()))
	if newest.interval > 0 {
		v.ResetAfter = max(0, newest.resetAfter-now.Sub(newest.sent)-time.Duration(left)*newest.interval)
		owed := math.Ceil(float64(v.ResetAfter)*float64(h.Limit)/float64(h.Window) - owedSlack)
		v.Remaining = uint64(max(0, float64(h.Capacity())-owed))
	}
}

// rebase takes in the store's answer v for k's counter at now, while k has
// slices or a lease on its way. A counter's hit and lease answers come in
// either order, and the later state has the less left (for GCRA, the later
// bucket time), but a give-back's (gave: a refund or a settlement), which
// leaves more, is the latest. A lease then installs, and the slices
// answer, from the latest. The caller holds k's shard's lock.
func (k *hotKey) rebase(v limiter.Verdict, gave bool, sent, now time.Time) {
	if k.leasing {
		k.seenRemaining = min(k.seenRemaining, v.Remaining)
		if tat := now.Add(v.ResetAfter); v.Admitted && tat.After(k.seenTAT) {
			k.seenTAT = tat
		}
		if gave {
			k.seenRemaining, k.seenTAT = v.Remaining, now.Add(v.ResetAfter)
		}
	}
	if len(k.slices) == 0 {
		return
	}
	newest := k.slices[len(k.slices)-1]
	// An answer of a later fixed window than a slice's says the slice's
	// ended: the count is the new window's alone. The answer's window ends
	// no earlier than its sending plus its reset; the slice's from its
	// expiry on (its lease's sending plus its reset), a later window's a
	// whole window after that: one of the slice's own window passes three
	// quarters of a window after its expiry only if the lease took that
	// long to reach the store. (windowEnd, the latest the slice's could
	// end, is as late as the lease's answer was.)
	later := func(sl *slice) bool {
		return !sl.windowEnd.IsZero() && sent.Add(v.ResetAfter).After(sl.expires.Add(k.rule.Window*3/4))
	}
	for _, sl := range k.slices {
		if later(sl) && now.Before(sl.windowEnd) {
			sl.windowEnd = now
		}
	}
	if v.Remaining < newest.remaining+k.landed || gave || later(newest) {
		newest.remaining, k.landed = v.Remaining, 0
	}
	if tat := now.Add(v.ResetAfter); newest.interval > 0 && v.Admitted && (gave || tat.After(newest.sent.Add(newest.resetAfter))) {
		newest.resetAfter = tat.Sub(newest.sent)
	}
}

// owedSlack bounds the rounding in GCRA's units owed read from a reset (up
// to the microsecond, the interval to the nanosecond: far under 1e-3 unit).
const owedSlack = 1e-3

// pendingLease is a lease waiting to be sent with the others of its moment.
type pendingLease struct {
	hit    limiter.Hit
	period time.Duration // the log's slices end with it; a failed lease is retried after it
	idle   time.Duration // the slice ends after this long unused
	warm   bool          // of a warm key
	resets uint32        // its key's resets when it was sent
	landed chan struct{} // closed once its answer is in (see hotKey.inFlight)
}

// leaseGather is how long a lease waits for others, to share a store call
// (the batcher takes what is queued); the hits meanwhile go to the store.
const leaseGather = 5 * time.Millisecond

// queueLease queues l, and starts the gathering of the leases queued with
// it when it is the first. The caller holds a shard's lock.
func (s *Slices) queueLease(l pendingLease) {
	s.leasesMu.Lock()
	defer s.leasesMu.Unlock()
	s.leases = append(s.leases, l)
	if len(s.leases) == 1 {
		s.work.Add(1)
		s.later(leaseGather, s.sendLeases)
	}
}

// sendLeases sends the queued leases at once, each its own request.
func (s *Slices) sendLeases() {
	defer s.work.Done()
	s.leasesMu.Lock()
	leases := s.leases
	s.leases = nil
	s.leasesMu.Unlock()
	for _, l := range leases {
		s.spawn(func() { s.lease(l) })
	}
}

// ends is when k's last live slice ends.
func (k *hotKey) ends(now time.Time) time.Time {
	end := now
	for _, sl := range k.slices {
		if sl.expires.After(end) {
			end = sl.expires
		}
	}
	return end
}

// lease charges the counter for a slice of l.hit.Cost units for its key.
func (s *Slices) lease(l pendingLease) {
	h, period := l.hit, l.period
	sh := s.shard(h.Key)
	sh.mu.Lock()
	// A Reset on its way when the lease goes may land before or after its
	// write: the lease is then not installed (below). One that began
	// later changes the key's resets; one that ended before, nothing.
	overlapped := s.resetting.Load() > 0
	if k := sh.keys[h.Key]; k != nil {
		k.inFlight = l.landed
		l.resets = k.resets
	}
	sh.mu.Unlock()
	defer close(l.landed)
	sent := s.now()
	verdicts, err := s.ledger.Decide(s.ctx, []limiter.Hit{h})
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[h.Key]
	if k == nil { // dropped by a tick while leasing: keep it, to end the slice
		k = &hotKey{seenRemaining: math.MaxUint64}
		sh.keys[h.Key] = k
	}
	k.leasing = false
	if k.inFlight == l.landed {
		k.inFlight = nil
	}
	now := s.now()
	if overlapped || k.resets != l.resets {
		// A Reset while the lease was on its way: its units are not ours
		// to spend; the charge's token takes back what it still holds. (A
		// lease queued before a Reset and sent after it is installed.)
		if err == nil && len(verdicts) == 1 && verdicts[0].Charged {
			s.returnsMu.Lock()
			s.returns = append(s.returns, limiter.Return{Hit: h, Token: verdicts[0].Token, Units: h.Cost})
			s.returnsMu.Unlock()
		}
		return
	}
	if err != nil || len(verdicts) != 1 || verdicts[0].FailureVerdict {
		k.retryAt = now.Add(period) // the store failed: the hits say so
		return
	}
	v := verdicts[0]
	if !v.Admitted || !v.Charged {
		k.remaining, k.known, k.answered = v.Remaining, true, now
		k.retryAt = now.Add(min(period, v.ResetAfter))
		return
	}
	sl := &slice{n: h.Cost, token: v.Token, sent: sent, expires: sent.Add(period), lastUse: now, idle: l.idle,
		remaining: min(v.Remaining, k.seenRemaining), resetAfter: v.ResetAfter}
	if h.Algorithm == config.GCRA && k.seenTAT.After(sent.Add(v.ResetAfter)) {
		sl.resetAfter = k.seenTAT.Sub(sent) // a hit charged after the lease answered first
	}
	switch h.Algorithm {
	case config.FixedWindow:
		sl.expires = sent.Add(v.ResetAfter)
		sl.windowEnd = now.Add(v.ResetAfter) // the charge came before its answer
	case config.SlidingWindowCounter:
		sl.expires = sent.Add(v.ResetAfter - h.Window)
	case config.GCRA:
		// The charge's slots end at the TAT, ResetAfter after the charge
		// (rounded up to the microsecond): unit k's starts (n-k) intervals
		// before it. The interval rounded up, and the charge's time taken
		// as the lease's sending, make every deadline early, never late.
		sl.interval = (h.Window + time.Duration(h.Limit) - 1) / time.Duration(h.Limit)
		sl.first = sent.Add(v.ResetAfter - time.Microsecond - time.Duration(sl.n)*sl.interval)
		sl.expires = sl.first.Add(time.Duration(sl.n-1) * sl.interval).Add(1)
	}
	if !k.matches(&h) {
		k.endAll(s, now) // of another rule, after a reload
		k.rule = h
		k.rule.Cost, k.rule.Ahead = 0, 0
	}
	k.slices = append(k.slices, sl)
	k.remaining, k.known, k.answered = v.Remaining, true, now
	k.landed, k.landedLeasing = k.landedLeasing, 0 // what landed first is in v.Remaining, maybe
	if s.observe.Leased != nil {
		s.observe.Leased(sl.n)
	}
	if l.warm && s.observe.Warm != nil {
		s.observe.Warm(sl.n)
	}
}

// endAll ends every slice of k, giving back what they did not use.
// The caller holds k's shard's lock.
func (k *hotKey) endAll(s *Slices, now time.Time) {
	for _, sl := range k.slices {
		s.giveBack(k, sl, now)
	}
	k.slices = k.slices[:0]
}

// giveBack queues the units sl, a slice of k, did not use, to go back at
// the next tick with the others', when its algorithm can and they still
// count: not GCRA's (their slots passed, or later charges follow them),
// nor an ended fixed window's. A log's slice is kept in k.recorded while
// its members may be ahead (its period again past its end, lest Redis's
// clock be ahead of this instance's). The caller holds k's shard's lock.
func (s *Slices) giveBack(k *hotKey, sl *slice, now time.Time) {
	rule := k.rule
	if rule.Algorithm == config.SlidingWindowLog {
		k.recorded = append(k.recorded, recorded{
			all:   limiter.Return{Hit: rule, Token: sl.token, Units: sl.n},
			until: sl.expires.Add(sl.expires.Sub(sl.sent)),
		})
	}
	left := sl.n - sl.used
	if sl.interval > 0 || left == 0 {
		return
	}
	sl.used = sl.n
	if !sl.windowEnd.IsZero() && !now.Before(sl.windowEnd) {
		// Its count is never read again: a give back would only cost
		// Redis calls, for every slice of the window at once.
		return
	}
	k.unlanded += left
	sl.returned = left
	s.returnsMu.Lock()
	s.returns = append(s.returns, limiter.Return{Hit: rule, Token: sl.token, Units: left})
	s.returnsMu.Unlock()
}

// returnsPerCall bounds the returns of one store call: a call holds Redis
// while it runs, and the decisions waiting behind it have Envoy's 20 ms.
const returnsPerCall = 32

// flush gives back the queued returns, returnsPerCall at a time, each
// chunk in one store call per hash slot.
func (s *Slices) flush() {
	s.returnsMu.Lock()
	returns := s.returns
	s.returns = nil
	s.returnsMu.Unlock()
	for chunk := range slices.Chunk(returns, returnsPerCall) {
		n, err := s.ledger.GiveBack(context.WithoutCancel(s.ctx), chunk) // a failure: the units stay counted
		if n > 0 && s.observe.GivenBack != nil {
			s.observe.GivenBack(n)
		}
		// The store may give back less than asked: a refund took some of
		// an ended slice's units first (a log's members, once its period
		// is over, are the newest up to now). Which return lacked them is
		// known only for a return alone in its call; the others then count
		// nothing as back, so that no answer says more remains than does.
		var asked uint64
		for _, r := range chunk {
			asked += r.Units
		}
		for _, r := range chunk {
			back := r.Units
			if err != nil || n < asked && len(chunk) > 1 {
				back = 0
			} else if n < asked {
				back = n
			}
			s.landed(r, back)
		}
	}
}

// landed notes that r's units are no longer queued, and that back of them
// were given back (none after a failure: they stay counted).
func (s *Slices) landed(r limiter.Return, back uint64) {
	sh := s.shard(r.Hit.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.keys[r.Hit.Key]
	if k == nil {
		return
	}
	k.unlanded -= min(k.unlanded, r.Units)
	k.landed += back
	if k.leasing {
		// Whether the lease's answer counted them is not known: as if not.
		k.landedLeasing += back
	}
}

// Reset drops this instance's slices of h's counter, unused units and
// all (their counter is going; a log's members with them), and a lease of
// it on its way, and deletes the counter (the admin API's Reset). Other
// instances' slices of it live on: the log keeps their members (recorded
// ahead); for the other algorithms the reset deletes their records, so
// what they give back later takes nothing off the new count (reset.lua).
func (s *Slices) Reset(ctx context.Context, h limiter.Hit) (int64, error) {
	s.resetting.Add(1)
	defer s.resetting.Add(-1)
	sh := s.shard(h.Key)
	sh.mu.Lock()
	var own []limiter.Return // this instance's slices' log members, which the reset would keep
	if k := sh.keys[h.Key]; k != nil {
		for _, r := range k.recorded {
			own = append(own, r.all)
		}
		for _, sl := range k.slices {
			if k.rule.Algorithm == config.SlidingWindowLog {
				own = append(own, limiter.Return{Hit: k.rule, Token: sl.token, Units: sl.n})
			}
		}
		k.slices, k.recorded, k.known = nil, nil, false
		k.resets++ // a lease on its way is not installed
	}
	sh.mu.Unlock()
	if len(own) > 0 {
		if _, err := s.ledger.GiveBack(ctx, own); err != nil {
			return 0, err
		}
	}
	return s.ledger.Reset(ctx, h)
}
