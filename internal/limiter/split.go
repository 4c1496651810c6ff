package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Split decides the hits whose window is one second on a limiter of their
// own, on another Redis, and all others on the main one (envoyproxy/
// ratelimit's REDIS_PERSECOND); without a per-second limiter everything
// goes to the main one. All or nothing across the two stores holds as
// across Redis Cluster slots: both parts are decided at once, and when the
// request turns out denied, the charges made are undone by their tokens
// (refund.go). The reference never gives back.
type Split struct {
	main, perSecond *Limiter

	// life is held for reading by Decide, for writing by Close: the calls
	// in flight end before the limiters wait for their refunds.
	life   sync.RWMutex
	closed bool
}

// NewSplit returns a Split sending one-second hits to perSecond, the
// others to main; a nil perSecond sends everything to main.
func NewSplit(main, perSecond *Limiter) *Split {
	return &Split{main: main, perSecond: perSecond}
}

// perSecondHit reports a hit that goes to the per-second store.
func perSecondHit(h *Hit) bool { return h.Window == time.Second }

// of returns the limiter of h.
func (s *Split) of(h *Hit) *Limiter {
	if s.perSecond != nil && perSecondHit(h) {
		return s.perSecond
	}
	return s.main
}

// Decide decides hits as Limiter.Decide does, each on its limiter, and
// returns their verdicts in the order of hits. Each store's failure
// answers its own hits by their failure modes; the errors are joined.
func (s *Split) Decide(ctx context.Context, hits []Hit) ([]Verdict, error) {
	if s.perSecond == nil {
		return s.main.Decide(ctx, hits)
	}
	// Nearly every request's hits go to one store: nothing allocated.
	nSecond := 0
	for i := range hits {
		if perSecondHit(&hits[i]) {
			nSecond++
		}
	}
	switch nSecond {
	case 0:
		return s.main.Decide(ctx, hits)
	case len(hits):
		return s.perSecond.Decide(ctx, hits)
	}
	second, other := make([]int, 0, nSecond), make([]int, 0, len(hits)-nSecond)
	for i := range hits {
		if perSecondHit(&hits[i]) {
			second = append(second, i)
		} else {
			other = append(other, i)
		}
	}
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return failureVerdicts(hits), ErrClosed
	}
	parts := [2]struct {
		lim      *Limiter
		idx      []int
		verdicts []Verdict
		err      error
	}{{lim: s.perSecond, idx: second}, {lim: s.main, idx: other}}
	var wg sync.WaitGroup
	for p := range parts {
		part := &parts[p]
		sub := make([]Hit, len(part.idx))
		for j, i := range part.idx {
			sub[j] = hits[i]
			sub[j].part = true
			// A part does not see the quota hits of the other: its quota
			// hits go as shadow hits, and takenBack below applies the quota
			// rule to the whole request.
			if sub[j].quota() {
				sub[j].Shadow = true
			}
		}
		wg.Go(func() { part.verdicts, part.err = part.lim.Decide(ctx, sub) })
	}
	wg.Wait()
	verdicts := make([]Verdict, len(hits))
	for _, part := range parts {
		for j, i := range part.idx {
			verdicts[i] = part.verdicts[j]
		}
	}
	// Two quotas with a counter in common (which Limiter.Decide makes one)
	// stay two here: a part decides them as shadow hits, and each takes
	// back its own share.
	if back := takenBack(hits, verdicts); back != nil {
		for _, part := range parts {
			part.lim.undo(ctx, "give back of a request denied on the other store", hits, part.idx, verdicts, back)
		}
	}
	return verdicts, errors.Join(parts[0].err, parts[1].err)
}

// Reset resets h's counter on its limiter (Limiter.Reset).
func (s *Split) Reset(ctx context.Context, h Hit) (int64, error) {
	return s.of(&h).Reset(ctx, h)
}

// Numbers runs c where the hits of its Window go (Limiter.Numbers): a
// registry beside a one-second counter lives on the per-second store.
func (s *Split) Numbers(ctx context.Context, c Call) ([]uint64, error) {
	return s.of(&Hit{Window: c.Window}).Numbers(ctx, c)
}

// GiveBack gives back the returns, each on its hit's limiter, as
// Limiter.GiveBack does.
func (s *Split) GiveBack(ctx context.Context, returns []Return) (uint64, error) {
	if s.perSecond == nil {
		return s.main.GiveBack(ctx, returns)
	}
	var main, second []Return
	for _, r := range returns {
		if perSecondHit(&r.Hit) {
			second = append(second, r)
		} else {
			main = append(main, r)
		}
	}
	n1, err1 := s.main.GiveBack(ctx, main)
	n2, err2 := s.perSecond.GiveBack(ctx, second)
	return n1 + n2, errors.Join(err1, err2)
}

// Prepare prepares both limiters at once (Limiter.Prepare); the errors are
// joined.
func (s *Split) Prepare(ctx context.Context) error {
	if s.perSecond == nil {
		return s.main.Prepare(ctx)
	}
	var errSecond error
	var wg sync.WaitGroup
	wg.Go(func() { errSecond = s.perSecond.Prepare(ctx) })
	errMain := s.main.Prepare(ctx)
	wg.Wait()
	if errSecond != nil {
		errSecond = fmt.Errorf("per-second store: %w", errSecond)
	}
	return errors.Join(errMain, errSecond)
}

// Close waits for the calls in flight, then closes both limiters, which
// wait for their refunds.
func (s *Split) Close() {
	s.life.Lock()
	s.closed = true
	s.life.Unlock()
	s.main.Close()
	if s.perSecond != nil {
		s.perSecond.Close()
	}
}
