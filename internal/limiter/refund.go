package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// refundScript undoes the charges of a request denied across cluster slots.
var refundScript = redis.NewScript(lua.Refund())

// refund takes back, in the background, the charges of a request that was
// denied, so that its answer waits for no more than its deadline. The
// verdicts say uncharged at once; until the refund lands (one round trip)
// other requests can see the charge. The refund has a deadline of its own
// and outlives the caller's cancellation. A charge that cannot be taken back
// stays counted until its window forgets it; the failure reaches Observe.
func (l *Limiter) refund(ctx context.Context, hits []Hit, groups [][]int, verdicts []Verdict, tokens []int64) {
	ctx = context.WithoutCancel(ctx)
	for _, group := range groups {
		var keys []string
		var args []any
		for _, i := range group {
			// A recorded cost was spent whatever the request's fate: it stays.
			if v := &verdicts[i]; v.Charged && !hits[i].Record {
				var err error
				if args, err = refundArgs(args, &hits[i], tokens[i]); err != nil {
					continue // Decide refused the hit already
				}
				keys = append(keys, hits[i].Key)
				v.Charged = false
				v.Remaining = min(v.Remaining+hits[i].Cost, uint64(hits[i].capacity()))
			}
		}
		if len(keys) == 0 {
			continue
		}
		l.refunds.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, l.timeout)
			defer cancel()
			start := time.Now()
			err := l.script(ctx, refundScript, keys, args).Err()
			if err != nil {
				err = fmt.Errorf("%w: refund of a request denied across slots: %w", ErrStore, err)
			}
			l.observe(time.Since(start), err)
		})
	}
}

// deniedAny reports whether the request is denied: an enforced hit that is
// not a quota hit was denied, or the request has quota hits and none fits.
func deniedAny(hits []Hit, verdicts []Verdict) bool {
	quotas, quotaFits := false, false
	for i, v := range verdicts {
		switch {
		case hits[i].quota():
			quotas = true
			quotaFits = quotaFits || v.Admitted
		case !v.Admitted && !hits[i].Shadow:
			return true
		}
	}
	return quotas && !quotaFits
}
