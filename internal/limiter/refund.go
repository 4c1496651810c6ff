package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// refundScript undoes the charges of a request denied across cluster slots,
// those of its quotas that turned out over, and the leases whose caller
// never heard of them (Limiter.orphanedLeases).
var refundScript = redis.NewScript(lua.Refund())

// All or nothing across Redis Cluster slots is this refund, not one atomic
// call: a script's keys must share a slot, and the slots of a request live
// on masters that no transaction spans. Each slot's group is decided
// atomically at once (decide.lua), and when the whole request turns out
// denied, or one of its quotas over (a slot sees only its own quota hits,
// and charges those that fit), the charges are undone by the tokens
// decide.lua returned, which name the very charge (the log's members, the
// counter's window, the end of GCRA's charge): exact, where a Refund hit
// would give back to whatever window is current, or another request's log
// members. Split gives back across its two stores the same way (undo).

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
// when its request turns out denied (or its quota over). A recorded cost was
// spent whatever the request's fate, and a refund is always applied: neither
// is taken back. The Cluster refund and Split's give-back share it (through
// takenBack), with takeBack.
func owesBack(h *Hit, v *Verdict) bool { op := h.op(); return v.Charged && op.Charges && !op.Record }

// takeBack says in v, the verdict of h, that its charge was given back: not
// charged, and the cost remaining again.
func takeBack(h *Hit, v *Verdict) {
	v.Charged, v.Token, v.Lease, v.part, v.generation = false, 0, "", "", 0
	v.Remaining = min(v.Remaining+h.Cost, uint64(h.Capacity()))
}

// refund takes back, in the background, the charges of the hits back
// marks (takenBack, or orphaned leases; what names the refund in a
// failure), so that the answer waits for no more than its deadline. The verdicts say uncharged at once; until the refund lands (one
// round trip) other requests can see the charge. The refund has a deadline
// of its own and outlives the caller's cancellation. A charge that cannot be
// taken back stays counted until its window forgets it; the failure reaches
// Observe.
func (l *Limiter) refund(ctx context.Context, what string, hits []Hit, groups [][]int, verdicts []Verdict, tokens []int64, back []bool) {
	ctx = context.WithoutCancel(ctx)
	for _, group := range groups {
		var keys, records []string
		var args []any
		for _, i := range group {
			h, v := &hits[i], &verdicts[i]
			if !back[i] {
				continue
			}
			var err error
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
			if args, err = refundArgs(args, h, token); err != nil {
				continue // Decide refused the hit already
			}
			keys = append(keys, h.Key)
			if readsRecords(h, tokens[i]) {
				records = append(records, sliceRecordKey(h.Key))
			}
			takeBack(h, v)
		}
		if len(keys) == 0 {
			continue
		}
		if l.denied != nil {
			for _, k := range keys {
				l.denied.forget(k) // units come back: a denial remembered may no longer hold
			}
		}
		keys = append(keys, records...) // declared after every charge's key, as decide's
		l.refunds.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, l.timeout)
			defer cancel()
			start := time.Now()
			err := l.script(ctx, lua.RefundFunction(), refundScript, keys, args).Err()
			if err != nil {
				err = fmt.Errorf("%w: %s: %w", ErrStore, what, err)
			}
			l.observe(time.Since(start), err)
		})
	}
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
	bySlot := map[int][]int{}
	var slots []int
	for i, r := range returns {
		if r.Units == 0 {
			continue
		}
		slot := l.router.slot(r.Hit.Key)
		if _, ok := bySlot[slot]; !ok {
			slots = append(slots, slot)
		}
		bySlot[slot] = append(bySlot[slot], i)
	}
	var total uint64
	var errs []error
	for _, slot := range slots {
		var keys, records []string
		var args []any
		for _, i := range bySlot[slot] {
			h := returns[i].Hit
			h.Cost = returns[i].Units
			var token any = returns[i].Token
			if h.Algorithm == config.SlidingWindowLog {
				token = sliceName(returns[i].Token)
			}
			var err error
			if args, err = refundArgs(args, &h, token); err != nil {
				errs = append(errs, fmt.Errorf("give back: %w", err))
				continue
			}
			keys = append(keys, h.Key)
			if readsRecords(&h, returns[i].Token) {
				records = append(records, sliceRecordKey(h.Key))
			}
		}
		if len(keys) == 0 {
			continue
		}
		keys = append(keys, records...) // declared after every charge's key, as decide's
		n, err := l.giveBack(ctx, keys, args)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		total += n
		if l.denied != nil {
			for _, k := range keys {
				l.denied.forget(k)
			}
		}
	}
	return total, errors.Join(errs...)
}

// readsRecords reports whether the undo of h's charge of token reads the
// slices' records beside its key (sliceRecordKey), which its call must
// declare: a counter's or GCRA's slice, by its record, and any GCRA charge,
// whose undo never takes from under a live slice.
func readsRecords(h *Hit, token int64) bool { return token < 0 || h.Algorithm == config.GCRA }

// sliceName is the base name of the members of a log's slice (a charge
// with Hit.Ahead) whose token is score: "A<score>" (the log's commit).
func sliceName(score int64) string { return "A" + strconv.FormatInt(score, 10) }

// giveBack runs one refund call within the limiter's timeout, observed.
func (l *Limiter) giveBack(ctx context.Context, keys []string, args []any) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	n, err := l.script(ctx, lua.RefundFunction(), refundScript, keys, args).Int64()
	l.observe(time.Since(start), err)
	if err != nil {
		return 0, fmt.Errorf("%w: give back: %w", ErrStore, err)
	}
	return uint64(max(n, 0)), nil
}
