package limiter

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

var resetScript = redis.NewScript(lua.Reset())

// Reset deletes the counter of h, so that its whole limit is available again
// at once, and returns how many store keys it deleted (0 when the counter was
// empty). Only h.Key is read, and h.Algorithm checked: every algorithm
// keeps its whole state at its key, but for the slices' records
// (sliceRecordKey) and an RLQS fleet's count of the counter (FleetSuffix),
// which go with it (for the reference's keys, which have no hash tag, by a
// second call). A failure wraps ErrStore.
func (l *Limiter) Reset(ctx context.Context, h Hit) (int64, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	if h.Key == "" {
		return 0, errors.New("reset: empty key")
	}
	if err := checkAlgorithms([]Hit{h}); err != nil {
		return 0, fmt.Errorf("reset: %w", err)
	}
	l.forget([]string{h.Key})
	fleet := h.Key + FleetSuffix // an RLQS fleet's count of it goes alike
	keys := []string{h.Key, fleet}
	if h.Algorithm.ReferenceKeys() {
		keys = keys[:1] // no hash tag: the fleet's count may be on another Cluster slot, reset by a call of its own
	}
	if recordsSlices(h.Algorithm) {
		keys = append(keys, sliceRecordKey(keys[0]), sliceRecordKey(keys[1])) // their slices' records go with them
	}
	n, err := l.timed(ctx, "", resetScript, keys, nil).Int64()
	if err == nil && h.Algorithm.ReferenceKeys() {
		err = l.timed(ctx, "", resetScript, []string{fleet}, nil).Err()
	}
	if err != nil {
		return 0, fmt.Errorf("%w: reset: %w", ErrStore, err)
	}
	return n, nil
}
