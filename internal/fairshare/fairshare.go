// Package fairshare keeps the registries that split one limit among those
// who take from it: an RLQS counter's Envoys (Assign, Confirm) and a global
// limit's regions on the ledger (Allow). Each call is one atomic script
// beside the counter it splits (scripts/lua: rlqs_shares.lua,
// rlqs_confirm.lua, region_allowance.lua), each grant a max-min fair share
// of what the others do not hold, so that grants never sum past the limit
// whatever the order of the calls. It knows nothing of gRPC.
package fairshare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// Store runs a registry's calls where the counter's hits go: a
// *limiter.Limiter or a *limiter.Split. A failure wraps limiter.ErrStore.
type Store interface {
	Numbers(ctx context.Context, c limiter.Call) ([]uint64, error)
}

var (
	sharesScript    = redis.NewScript(lua.RLQSShares())
	confirmScript   = redis.NewScript(lua.RLQSConfirm())
	allowanceScript = redis.NewScript(lua.RegionAllowance())
)

// ShareRequest asks for one Envoy's part of a limit (RLQS): the registry at
// Key holds every live member's demand and assignment on one counter.
type ShareRequest struct {
	// Key is the registry key: the counter's key in this service's schema
	// followed by ":rlqs", so that both share a cluster slot.
	Key string
	// Member is the Envoy stream's id.
	Member string
	// Demand is the units per Window the Envoy asks for; unknown (< 0 or
	// NaN: a first report), it asks for all of Limit, to get an equal share.
	Demand float64
	// Limit is the units per Window the whole fleet may take.
	Limit uint64
	// Window is the limit's window, whole seconds.
	Window time.Duration
	// Current is the T the member holds now (0: none); a new share close to
	// it keeps it (see Assign), since Envoy restarts a changed bucket full.
	Current uint64
	// ReportInterval is R, Envoy's reporting period: the bucket's size is
	// about one R of refill, M = max(1, ceil(T * min(R, W) / W)).
	ReportInterval time.Duration
	// Lease is how long the assignment lives: the member's entry ends Lease
	// after Redis TIME now, and the registry expires 2*Lease after the last
	// report (or at the latest lease end).
	Lease time.Duration
}

// Share is the member's part of the limit.
type Share struct {
	// Tokens is T, the units per Window granted (0: none left).
	Tokens uint64
	// MaxTokens is M, the token bucket's size for Tokens (0 when Tokens is 0).
	MaxTokens uint64
	// Lookahead is the units the OTHER live members' buckets may still
	// refill before their leases end: ceil(sum of T * (lease end - now) /
	// Window). A bucket's first fill (M) is not leased.
	Lookahead uint64
}

// Assign records r's demand in its registry and decides the member's share:
// the max-min fair share of Limit among the live members' demands, rounded
// up and at least 1, kept at Current when at most a fifth below it (leaving
// the others their fair shares) or at most 5 % above, and capped so that
// the T the members hold never sum past Limit whatever the order of the
// calls: an entry keeps the larger of Current and its new share until
// Confirm, or its next call. A Limit of 0 answers Share{} without a store
// call. A bad request (empty Key or Member, a Window not whole seconds, a
// Lease under a second, a ReportInterval under a millisecond) is an error
// that does not wrap limiter.ErrStore.
func Assign(ctx context.Context, st Store, r ShareRequest) (Share, error) {
	if err := checkShare(r); err != nil {
		return Share{}, fmt.Errorf("share: %w", err)
	}
	if r.Limit == 0 {
		return Share{}, nil
	}
	n, err := st.Numbers(ctx, limiter.Call{What: "share", Script: sharesScript, Key: r.Key, Window: r.Window, Numbers: 3,
		Args: []any{r.Member, demandArg(r.Demand, r.Limit), r.Limit, r.Window.Milliseconds(),
			r.Current, r.ReportInterval.Milliseconds(), r.Lease.Milliseconds()}})
	if err != nil {
		return Share{}, err
	}
	return Share{Tokens: n[0], MaxTokens: n[1], Lookahead: n[2]}, nil
}

func checkShare(r ShareRequest) error {
	switch {
	case r.Key == "":
		return errors.New("empty key")
	case r.Member == "":
		return errors.New("empty member")
	case r.Window < time.Second || r.Window%time.Second != 0:
		return fmt.Errorf("window %v is not whole seconds", r.Window)
	case r.Lease < time.Second:
		return fmt.Errorf("lease %v is under a second", r.Lease)
	case r.ReportInterval < time.Millisecond:
		return fmt.Errorf("report interval %v is under a millisecond", r.ReportInterval)
	}
	return nil
}

// Confirm lowers member's entry in the registry at key (of a limit of
// window) to tokens once that share was sent (Assign keeps the larger T
// until then). An expired entry, or one holding no more, stays as is.
func Confirm(ctx context.Context, st Store, key, member string, window time.Duration, tokens uint64) error {
	if key == "" || member == "" {
		return errors.New("confirm share: empty key or member")
	}
	_, err := st.Numbers(ctx, limiter.Call{What: "confirm share", Script: confirmScript, Key: key, Window: window,
		Numbers: 1, Args: []any{member, tokens}})
	return err
}

// AllowanceRequest asks the ledger for one region's part of a global limit,
// whose registry at Key holds every region's demand, grant and count.
type AllowanceRequest struct {
	// Key is the registry key on the ledger.
	Key string
	// Region is the asking region's name.
	Region string
	// Demand is the units per Window the region asks for, its floor
	// included; < 0 (or NaN) is unknown and asks for the whole Limit.
	Demand float64
	// Count is the units the region's own counter holds now: what it
	// counts stays counted (see Allow).
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
	// Floor is what each of the Regions keeps whatever happens, asking or not.
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

// Allow records r's demand and count in its registry on the ledger and
// decides the region's grant: its max-min fair share, among the regions
// whose lease lives, of the limit less every region's floor, never more
// than the other regions do not reserve. A region reserves the most of its
// grant, its Current (for good when the answer is lost) and its count past
// the floor, while its lease lives and a window and a lease after (what it
// counted stays counted a window; its record of the lease may end later
// than the ledger's by the answer's delay), so that the regions' counters
// never sum past Limit, whatever the order of the calls. A bad request
// (empty Key or Region, no Regions, a Window or Lease under a millisecond,
// floors past Limit) is an error that does not wrap limiter.ErrStore.
func Allow(ctx context.Context, st Store, r AllowanceRequest) (Grant, error) {
	if err := checkAllowance(r); err != nil {
		return Grant{}, fmt.Errorf("allowance: %w", err)
	}
	n, err := st.Numbers(ctx, limiter.Call{What: "allowance", Script: allowanceScript, Key: r.Key, Window: r.Window, Numbers: 2,
		Args: []any{r.Region, demandArg(r.Demand, r.Limit), r.Count, r.Current, r.Limit,
			r.Window.Milliseconds(), r.Lease.Milliseconds(), r.Floor, r.Regions, r.Turn}})
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

// demandArg is a demand as the scripts read it: -1 when unknown (< 0 or
// NaN), at most limit (+Inf too: the scripts read no "+Inf").
func demandArg(demand float64, limit uint64) string {
	switch {
	case math.IsNaN(demand) || demand < 0:
		demand = -1
	case demand > float64(limit):
		demand = float64(limit)
	}
	return strconv.FormatFloat(demand, 'f', -1, 64)
}
