package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Call is one atomic script of one key that answers whole numbers: how the
// registries kept beside the counters (internal/fairshare's shares and
// allowances, internal/regions' records) reach the store.
type Call struct {
	// What names the call in errors.
	What   string
	Script *redis.Script
	Key    string
	Args   []any
	// Numbers is how many whole numbers the reply holds.
	Numbers int
	// Window is the window of the counter the key sits beside: a Split
	// runs the call where that counter's hits go.
	Window time.Duration
}

// Numbers runs c on the server of its key (timed) and reads its reply. A
// failure wraps ErrStore.
func (l *Limiter) Numbers(ctx context.Context, c Call) ([]uint64, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return nil, ErrClosed
	}
	reply, err := l.timed(ctx, "", c.Script, []string{c.Key}, c.Args).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrStore, c.What, err)
	}
	if len(reply) != c.Numbers {
		return nil, fmt.Errorf("%w: %s: reply %q, want %d numbers", ErrStore, c.What, reply, c.Numbers)
	}
	out := make([]uint64, len(reply))
	for i, v := range reply {
		if out[i], err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: %s: reply %q: %w", ErrStore, c.What, reply, err)
		}
	}
	return out, nil
}
