package limiter

import (
	"context"
	"errors"
	"fmt"
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
	// Turn is the region's renewal turn, greater with each: a call of a
	// turn no later than one the ledger ran (one that timed out on its
	// way, run late) is granted nothing and changes nothing.
	Turn uint64
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
// for a window and a lease after (what it counted stays counted a window;
// the region's record of the lease may end later than the ledger's by the
// time the answer took to reach it),
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
	n, err := l.numbers(ctx, "allowance", allowanceScript, r.Key, []any{
		r.Region, demandArg(r.Demand, r.Limit), r.Count, r.Current, r.Limit,
		r.Window.Milliseconds(), r.Lease.Milliseconds(), r.Floor, r.Regions, r.Turn,
	}, 2)
	if err != nil {
		return Grant{}, err
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

var syncScript = redis.NewScript(lua.RegionSync())

// RegionSync is one instance's sync with its region's record of a global
// counter's grant, on the region's store: the record at Key is shared by
// the region's instances.
type RegionSync struct {
	// Key is the record's key.
	Key string
	// Instance names the syncing instance.
	Instance string
	// Demand is the units per window the instance sees asked.
	Demand float64
	// DemandTTL is how long the instance's demand counts in the region's.
	DemandTTL time.Duration
	// RenewAhead: the grant is renewed when its lease ends within it.
	RenewAhead time.Duration
	// RenewTTL is how long a renewer has before another may take over.
	RenewTTL time.Duration
	// Set ends a renewer's Turn, writing the ledger's answer: Grant, and
	// Lease, the time left of its lease; or, with Release, nothing (the
	// ledger failed: the next sync renews). Only the instance whose turn
	// it is, while it lasts, writes.
	Set     bool
	Turn    uint64
	Release bool
	Grant   uint64
	Lease   time.Duration
}

// RegionState is a region's record of a global counter's grant.
type RegionState struct {
	// Grant is the region's grant beyond its floor, 0 when its lease ended.
	Grant uint64
	// LeaseLeft is the time left of the grant's lease, by the region's
	// store's clock when it answered.
	LeaseLeft time.Duration
	// Demand is the region's: the sum of its instances' live demands.
	Demand float64
	// Renew: this instance is to ask the ledger, and to Set its answer,
	// in its Turn (greater than any before in the region).
	Renew bool
	Turn  uint64
}

// SyncRegion records r's demand in its region's record and reads the
// region's grant; it makes the instance the region's renewer when the
// grant's lease ends within RenewAhead and no other instance renews, and
// writes a renewer's answer (Set). One atomic script within the limiter's
// timeout, observed; a failure wraps ErrStore.
func (l *Limiter) SyncRegion(ctx context.Context, r RegionSync) (RegionState, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	if l.closed {
		return RegionState{}, ErrClosed
	}
	if r.Key == "" || r.Instance == "" || r.DemandTTL < time.Millisecond || r.RenewTTL < time.Millisecond {
		return RegionState{}, fmt.Errorf("sync region: bad request %+v", r)
	}
	args := []any{r.Instance, strconv.FormatFloat(max(0, r.Demand), 'f', 3, 64), r.DemandTTL.Milliseconds(),
		r.RenewAhead.Milliseconds(), r.RenewTTL.Milliseconds()}
	switch {
	case r.Set && r.Release:
		args = append(args, r.Turn, -1, 0)
	case r.Set:
		args = append(args, r.Turn, r.Grant, max(0, r.Lease.Milliseconds()))
	}
	n, err := l.numbers(ctx, "sync region", syncScript, r.Key, args, 5)
	if err != nil {
		return RegionState{}, err
	}
	return RegionState{Grant: n[0], LeaseLeft: time.Duration(n[1]) * time.Millisecond, Demand: float64(n[2]), Renew: n[3] == 1, Turn: n[4]}, nil
}
