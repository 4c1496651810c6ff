package limiter

// A request's demands on the store: one call per hash slot group (run),
// all groups at once, each through its server's batcher; across groups,
// all or nothing by refund (refund.go); and the deny cache's part of each
// answer (rememberDenials).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxAnswerMargin is the most of the caller's time kept back to send the
// answer; a tenth of the time left when that is less.
const maxAnswerMargin = 2 * time.Millisecond

// decide decides hits with distinct keys: one call per slot group (a
// script's keys share a slot), all groups at once; across groups, all or
// nothing holds by undoing the charges of a request that turned out
// denied, or of a quota that turned out over (refund.go).
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
		case h.Cost > uint64(h.Capacity()):
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
			l.refund(ctx, "refund of a request denied across slots", hits, groups, verdicts, tokens, back)
		}
	}
	return verdicts, errors.Join(errs...)
}

// deadline is when a request's store work must end: its caller's deadline
// less a margin to send the answer, at most the limiter's timeout from now
// (a deadline, not a context of its own, which would start a second timer).
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
// of a batch, and writes their verdicts, and their tokens when tokens is
// not nil. quotas is the request's rule as known before the store; nil
// sends quota hits as shadow hits. On an error the verdicts follow each
// hit's failure mode.
func (l *Limiter) run(ctx context.Context, deadline time.Time, hits []Hit, slot int, group []int, charge bool, quotas *requestRule,
	verdicts []Verdict, tokens []int64) error {
	keys := make([]string, len(group))
	var records []string // the keys of the slices' records the call writes
	var nonces []string  // of the group's leases, by index in group
	var parts []string   // of the group's log charges made as parts, by index in group
	args := make([]any, 1, 1+len(group))
	args[0] = len(group)
	if !charge {
		args[0] = -len(group)
	}
	now := l.now()
	for j, i := range group {
		keys[j] = hits[i].Key
		if recordsSlice(&hits[i]) {
			records = append(records, sliceRecordKey(hits[i].Key))
		}
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
		} else if charge && (hits[i].part || tokens != nil || hits[i].Ahead > 0) {
			var nonce string
			if arg, nonce = partArg(arg, &hits[i]); nonce != "" {
				if parts == nil {
					parts = make([]string, len(group))
				}
				parts[j] = nonce
			}
		}
		args = append(args, arg)
	}
	start, sent := time.Now(), l.now()
	c := &call{ctx: ctx, deadline: deadline, slot: slot, keys: keys, records: records, args: args, lateArgs: lateForm(hits, group, args)}
	lookup, lookupBy := ctx, deadline
	if c.lateArgs != nil { // see call.lateArgs
		lookup, lookupBy = context.WithoutCancel(ctx), time.Now().Add(l.timeout)
	}
	server, err := l.server(lookup, lookupBy, keys[0])
	var reply []int64
	if err == nil {
		if nonces != nil {
			c.orphan = l.orphanedLeases(hits, group, nonces)
		}
		reply, err = l.batcher(server).decide(c)
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
		state := r[0] & 3 // and, above, a charge's generation (decide.lua's reply)
		verdicts[i] = Verdict{
			Admitted:   state == 1 || state == 2,
			Charged:    state >= 2,
			Remaining:  uint64(max(r[1], 0)),
			ResetAfter: time.Duration(r[2]) * time.Microsecond,
			Token:      r[3],
			generation: r[0] >> 2,
		}
		if state == 2 && nonces != nil && nonces[j] != "" {
			verdicts[i].Lease = leaseID(min(hits[i].Cost, uint64(hits[i].Limit)), nonces[j])
		}
		if state == 2 && parts != nil {
			verdicts[i].part = parts[j]
		}
		if tokens != nil {
			tokens[i] = r[3]
		}
	}
	return nil
}

// lateForm is the late form (call.lateArgs) of the call of the hits at
// indexes group, with args, or nil when it has none: a call owed to the
// store whatever its caller does, as it holds an Owed operation (a
// settlement, a cost already spent: dropping it would hold a seat until
// its TTL, or leave a spent cost uncounted) and no NeverLate one. The late
// form only checks (a negative hit count): owed operations are applied
// whatever the request's fate, and nothing else is charged.
func lateForm(hits []Hit, group []int, args []any) []any {
	owed := false
	for _, i := range group {
		op := hits[i].op()
		if op.NeverLate {
			return nil
		}
		owed = owed || op.Owed
	}
	if !owed {
		return nil
	}
	late := slices.Clone(args)
	late[0] = -len(group)
	return late
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

// rememberDenials puts the group's enforced denials in the deny cache (not
// a Record hit's: the next report must reach the store), and drops the
// entries of counters a refund gave units back to.
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
