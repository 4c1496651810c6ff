package limiter

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
)

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
	return Verdict{FailureVerdict: true, Admitted: true, Remaining: uint64(h.Capacity())}
}
