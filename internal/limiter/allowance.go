package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

var allowanceScript = redis.NewScript(lua.RegionAllowance())

// AllowanceRequest asks the ledger for one region's part of a global limit:
// the registry at Key holds every region's demand, grant and count on one
// global counter.
type AllowanceRequest struct {
	// Key is the registry key on the ledger.
	Key string
	// Region is the asking region's name.
	Region string
	// Demand is the units per Window the region asks for, its floor
	// included; < 0 (or NaN) is unknown and asks for the whole Limit.
	Demand float64
	// Count is the units the region's own counter holds now: what it
	// counts stays counted (see Allowance).
	Count uint64
	// Current is the grant the region decides with now (0: none): it
	// keeps deciding with it until the answer reaches it.
	Current uint64
	// Limit is the units per Window all the regions may take together.
	Limit uint64
	// Window is the limit's window, whole milliseconds.
	Window time.Duration
	// Lease is how long the grant lives: the region's entry ends Lease
	// after the ledger's Redis TIME now.
	Lease time.Duration
	// Floor is the units every region keeps whatever happens, reserved
	// for each of the Regions whether it asks or not.
	Floor uint64
	// Regions is how many regions share Limit.
	Regions int
}

// Grant is a region's part of a global limit beyond its floor.
type Grant struct {
	// Units is the grant: the region may count up to its floor plus Units
	// per window until its lease ends.
	Units uint64
	// Room is what no region reserves after this grant: the part of the
	// limit beyond the floors that a region asking more could get.
	Room uint64
}

// Allowance records r's demand and count in its registry on the ledger
// and decides the region's grant: its max-min fair share, among the
// regions whose lease lives, of the limit less every region's floor, never
// more than what the other regions do not reserve. A region reserves the
// most of its grant, the grant it decided with when it asked (Current: it
// keeps deciding with it until the answer reaches it, or for good when the
// answer is lost) and its count past the floor, while its lease lives and
// for a window after (what it counted stays counted that long),
// so that the regions' counters never sum past Limit, whatever the order
// of the calls.
//
// Like Share it runs one atomic script (EVALSHA, re-sent with EVAL on
// NOSCRIPT) within the limiter's timeout, observed like every store call.
// A failure wraps ErrStore; a bad request (empty Key or Region, no Regions,
// a Window or Lease under a millisecond, floors past Limit) is an error
// that does not.
func (l *Limiter) Allowance(ctx context.Context, r AllowanceRequest) (Grant, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return Grant{}, ErrClosed
	}
	if err := checkAllowance(r); err != nil {
		return Grant{}, fmt.Errorf("allowance: %w", err)
	}
	demand := r.Demand
	switch {
	case math.IsNaN(demand) || demand < 0:
		demand = -1
	case demand > float64(r.Limit): // +Inf too: the script reads no "+Inf"
		demand = float64(r.Limit)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	start := time.Now()
	reply, err := l.script(ctx, allowanceScript, []string{r.Key}, []any{
		r.Region, strconv.FormatFloat(demand, 'f', -1, 64), r.Count, r.Current, r.Limit,
		r.Window.Milliseconds(), r.Lease.Milliseconds(), r.Floor, r.Regions,
	}).StringSlice()
	l.observe(time.Since(start), err)
	if err != nil {
		return Grant{}, fmt.Errorf("%w: allowance: %w", ErrStore, err)
	}
	if len(reply) != 2 {
		return Grant{}, fmt.Errorf("%w: allowance: reply %q, want 2 numbers", ErrStore, reply)
	}
	var n [2]uint64
	for i, s := range reply {
		if n[i], err = strconv.ParseUint(s, 10, 64); err != nil {
			return Grant{}, fmt.Errorf("%w: allowance: reply %q: %w", ErrStore, reply, err)
		}
	}
	return Grant{Units: n[0], Room: n[1]}, nil
}

func checkAllowance(r AllowanceRequest) error {
	switch {
	case r.Key == "":
		return errors.New("empty key")
	case r.Region == "":
		return errors.New("empty region")
	case r.Regions < 1:
		return fmt.Errorf("%d regions", r.Regions)
	case r.Window < time.Millisecond:
		return fmt.Errorf("window %v is under a millisecond", r.Window)
	case r.Lease < time.Millisecond:
		return fmt.Errorf("lease %v is under a millisecond", r.Lease)
	case r.Floor > 0 && uint64(r.Regions) > r.Limit/r.Floor:
		return fmt.Errorf("%d regions' floors of %d pass the limit %d", r.Regions, r.Floor, r.Limit)
	}
	return nil
}
