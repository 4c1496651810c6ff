package regions

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

var syncScript = redis.NewScript(lua.RegionSync())

// recordSync is one instance's sync with its region's record of a global
// counter's grant, on the region's store: the record at Key is shared by
// the region's instances.
type recordSync struct {
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

// recordState is a region's record of a global counter's grant.
type recordState struct {
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

// syncRecord records r's demand in its region's record and reads the
// region's grant; it makes the instance the region's renewer when the
// grant's lease ends within RenewAhead and no other instance renews, and
// writes a renewer's answer (Set). One atomic script on local
// (region_sync.lua); a failure wraps limiter.ErrStore.
func syncRecord(ctx context.Context, local *limiter.Limiter, r recordSync) (recordState, error) {
	if r.Key == "" || r.Instance == "" || r.DemandTTL < time.Millisecond || r.RenewTTL < time.Millisecond {
		return recordState{}, fmt.Errorf("sync region: bad request %+v", r)
	}
	args := []any{r.Instance, strconv.FormatFloat(max(0, r.Demand), 'f', 3, 64), r.DemandTTL.Milliseconds(),
		r.RenewAhead.Milliseconds(), r.RenewTTL.Milliseconds()}
	switch {
	case r.Set && r.Release:
		args = append(args, r.Turn, -1, 0)
	case r.Set:
		args = append(args, r.Turn, r.Grant, max(0, r.Lease.Milliseconds()))
	}
	n, err := local.Numbers(ctx, limiter.Call{What: "sync region", Script: syncScript, Key: r.Key, Args: args, Numbers: 5})
	if err != nil {
		return recordState{}, err
	}
	return recordState{Grant: n[0], LeaseLeft: time.Duration(n[1]) * time.Millisecond, Demand: float64(n[2]), Renew: n[3] == 1, Turn: n[4]}, nil
}
