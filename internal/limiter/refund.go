package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// refundScript undoes the charges of a request denied across cluster slots,
// those of its quotas that turned out over, and the leases whose caller
// never heard of them (Limiter.orphanedLeases).
var refundScript = redis.NewScript(lua.Refund())

// All or nothing across Redis Cluster slots (no transaction spans the
// masters of a request's slots) and across Split's two stores is an undo:
// each group is decided atomically, and when the request turns out denied,
// or a quota over, the charges are undone by the tokens decide.lua
// returned, which name the very charge (the log's members, the counter's
// window, the end of GCRA's charge), where a Refund hit would give back to
// whatever window is current, or another request's log members.

// undo takes back, in the background, the charges that back marks of the
// hits at idx (decided by this limiter, a part of a request Split decided
// across two stores), by the tokens of their verdicts: one refund call per
// hash slot. Hits on one Key were one charge (Decide merges them), named by
// one token: it is given back once, whole.
func (l *Limiter) undo(ctx context.Context, what string, hits []Hit, idx []int, verdicts []Verdict, back []bool) {
	tokens := make([]int64, len(hits))
	hits, back = slices.Clone(hits), slices.Clone(back)
	first := map[string]int{} // a charge's key: the first of its hits
	var merged []int
	for _, i := range idx {
		tokens[i] = verdicts[i].Token
		if !back[i] {
			continue
		}
		j, ok := first[hits[i].Key]
		if !ok {
			first[hits[i].Key] = i
			continue
		}
		hits[j].Cost = saturatingAdd(hits[j].Cost, hits[i].Cost)
		back[i] = false
		merged = append(merged, i)
	}
	for _, i := range merged {
		takeBack(&hits[first[hits[i].Key]], &verdicts[i]) // the merged charge's remaining
	}
	_, groups := l.groups(hits, idx)
	l.refund(ctx, what, hits, groups, verdicts, tokens, back)
}

// owesBack reports whether hit h, with verdict v, made a charge to take back
// when its request turns out denied (or its quota over): not a recorded
// cost, spent whatever the request's fate, nor a refund, always applied.
func owesBack(h *Hit, v *Verdict) bool { op := h.op(); return v.Charged && op.Charges && !op.Record }

// takeBack says in v, the verdict of h, that its charge was given back: not
// charged, and the cost remaining again.
func takeBack(h *Hit, v *Verdict) {
	v.Charged, v.Token, v.Lease, v.part, v.generation = false, 0, "", "", 0
	v.Remaining = min(v.Remaining+h.Cost, uint64(h.Capacity()))
}

// refund takes back, in the background, the charges of the hits back
// marks (takenBack, or orphaned leases; what names the refund in a
// failure): one refund call per group, so that the answer waits for no
// more than its deadline. The verdicts say uncharged at once; until the
// refund lands (one round trip) other requests can see the charge. A
// charge that cannot be taken back stays counted until its window forgets
// it; the failure reaches Observe.
func (l *Limiter) refund(ctx context.Context, what string, hits []Hit, groups [][]int, verdicts []Verdict, tokens []int64, back []bool) {
	ctx = context.WithoutCancel(ctx) // the refund outlives the caller's cancellation
	for _, group := range groups {
		var u undoCall
		for _, i := range group {
			h, v := &hits[i], &verdicts[i]
			if !back[i] {
				continue
			}
			var token any = tokens[i]
			switch {
			case v.Lease != "":
				token = leaseBase(v.Lease) // a lease's members are named by its nonce
			case v.part != "":
				token = partName(tokens[i], v.part)
			case h.Ahead > 0 && h.Algorithm == config.SlidingWindowLog:
				token = sliceName(tokens[i])
			case v.generation > 0 && tokens[i] > 0: // a slice's record (negative) names its charge alone
				token = strconv.FormatInt(tokens[i], 10) + "/" + strconv.FormatInt(v.generation, 10)
			}
			if u.add(h, tokens[i], token) == nil { // else Decide refused the hit already
				takeBack(h, v)
			}
		}
		if len(u.keys) > 0 {
			l.forget(u.keys)
			l.refunds.Go(func() { _, _ = l.undoCall(ctx, what, &u) })
		}
	}
}

// undoCall is one refund call: the undos of charges on one hash slot.
type undoCall struct {
	keys, records []string
	args          []any
}

// add appends the undo of h.Cost units of h's charge of token (its
// verdict's), named for refund.lua by name.
func (u *undoCall) add(h *Hit, token int64, name any) error {
	args, err := refundArgs(u.args, h, name)
	if err != nil {
		return err
	}
	u.args, u.keys = args, append(u.keys, h.Key)
	if readsRecords(h, token) {
		u.records = append(u.records, sliceRecordKey(h.Key))
	}
	return nil
}

// forget drops the deny cache's entries of keys, whose counters get units
// back: a denial remembered may no longer hold.
func (l *Limiter) forget(keys []string) {
	if l.denied != nil {
		for _, k := range keys {
			l.denied.forget(k)
		}
	}
}

// undoCall runs u (timed) and returns the units it gave back.
func (l *Limiter) undoCall(ctx context.Context, what string, u *undoCall) (uint64, error) {
	keys := append(u.keys, u.records...) // declared after every charge's key, as decide's
	n, err := l.timed(ctx, lua.RefundFunction(), refundScript, keys, u.args).Int64()
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrStore, what, err)
	}
	return uint64(max(n, 0)), nil
}

// Return is a give back: Units of a slice's charge (a Hit with Ahead) of
// Hit that Token (its Verdict's) names.
type Return struct {
	Hit   Hit
	Token int64
	Units uint64
}

// GiveBack undoes the returns: exactly the members of a log's charge, the
// counters' count of the charge's window (never another window's), GCRA's
// TAT by the units' time (never past now). Hot keys' slices give back what
// they did not use this way (internal/hotkeys' Slices), many at once: one
// refund call per hash slot. It returns the units given back, and drops
// the deny cache's entries of the counters. A failure wraps ErrStore; the
// returns of the slots that answered stand.
func (l *Limiter) GiveBack(ctx context.Context, returns []Return) (uint64, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	hits := make([]Hit, len(returns))
	var idx []int
	for i, r := range returns {
		hits[i] = r.Hit
		hits[i].Cost = r.Units
		if r.Units > 0 {
			idx = append(idx, i)
		}
	}
	_, groups := l.groups(hits, idx)
	var total uint64
	var errs []error
	for _, group := range groups {
		var u undoCall
		for _, i := range group {
			var name any = returns[i].Token
			if hits[i].Algorithm == config.SlidingWindowLog {
				name = sliceName(returns[i].Token)
			}
			if err := u.add(&hits[i], returns[i].Token, name); err != nil {
				errs = append(errs, fmt.Errorf("give back: %w", err))
			}
		}
		if len(u.keys) == 0 {
			continue
		}
		n, err := l.undoCall(ctx, "give back", &u)
		total += n
		errs = append(errs, err)
		l.forget(u.keys)
	}
	return total, errors.Join(errs...)
}

// readsRecords reports whether the undo of h's charge of token reads the
// slices' records beside its key (sliceRecordKey), which its call must
// declare: a slice's, by its record, and any charge of an algorithm that
// records slices, whose undo never takes what a slice holds.
func readsRecords(h *Hit, token int64) bool { return token < 0 || recordsSlices(h.Algorithm) }

// sliceName is the base name of the members of a log's slice (a charge
// with Hit.Ahead) whose token is score: "A<score>" (the log's commit).
func sliceName(score int64) string { return "A" + strconv.FormatInt(score, 10) }
