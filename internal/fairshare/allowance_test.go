package fairshare

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/slidingwindow/ratelimit/internal/limiter"
)

const allowanceKey = "test:k_v:regions"

// allowanceReq is region's request on allowanceKey for a limit of 100 a
// minute over three regions with no floor, on a 2 s lease.
func allowanceReq(region string, demand float64, count, current uint64) AllowanceRequest {
	return AllowanceRequest{
		Key: allowanceKey, Region: region, Demand: demand, Count: count, Current: current,
		Limit: 100, Window: time.Minute, Lease: 2 * time.Second, Regions: 3, Turn: turns.Add(1),
	}
}

// turns numbers the tests' calls: each a later turn than the last.
var turns atomic.Uint64

func grant1(t *testing.T, l *limiter.Limiter, r AllowanceRequest) Grant {
	t.Helper()
	g, err := Allow(context.Background(), l, r)
	if err != nil {
		t.Fatalf("Allowance(%+v): %v", r, err)
	}
	return g
}

// regionEntry is one region's registry entry as the script writes it.
type regionEntry struct {
	demand       float64
	grant        uint64
	leaseEnd     time.Time // ms of Redis TIME
	held, count  uint64
	limit, floor uint64 // 0: allowanceReq's, 100 and 0
	regions      int    // 0: allowanceReq's, 3
	turn         uint64
}

func (e regionEntry) String() string {
	limit, regions := e.limit, e.regions
	if limit == 0 {
		limit = 100
	}
	if regions == 0 {
		regions = 3
	}
	return fmt.Sprintf("%s %d %d %d %d %d %d %d %d", strconv.FormatFloat(e.demand, 'f', -1, 64), e.grant, e.leaseEnd.UnixMilli(),
		e.held, e.count, limit, e.floor, regions, e.turn)
}

func seedRegions(m *miniredis.Miniredis, entries map[string]regionEntry) {
	for region, e := range entries {
		m.HSet(allowanceKey, region, e.String())
	}
}

func regionEntries(t *testing.T, m *miniredis.Miniredis) map[string]regionEntry {
	t.Helper()
	got := map[string]regionEntry{}
	if !m.Exists(allowanceKey) {
		return got
	}
	keys, err := m.HKeys(allowanceKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		var e regionEntry
		var end int64
		if _, err := fmt.Sscanf(m.HGet(allowanceKey, k), "%g %d %d %d %d %d %d %d %d", &e.demand, &e.grant, &end, &e.held, &e.count,
			&e.limit, &e.floor, &e.regions, &e.turn); err != nil {
			t.Fatalf("entry %s = %q: %v", k, m.HGet(allowanceKey, k), err)
		}
		e.leaseEnd = time.UnixMilli(end)
		got[k] = e
	}
	return got
}

// TestAllowanceShares: a region's grant is its max-min fair share, among
// the regions whose lease lives, of the limit less every region's floor,
// never more than what the others reserve: their grant, the grant they
// decide with, their count past the floor, for a window past their lease.
func TestAllowanceShares(t *testing.T) {
	live := epoch.Add(time.Second)
	others := func(demands ...float64) map[string]regionEntry {
		m := map[string]regionEntry{}
		for i, d := range demands {
			m[fmt.Sprintf("r%d", i)] = regionEntry{demand: d, leaseEnd: live}
		}
		return m
	}
	for _, tt := range []struct {
		name   string
		others map[string]regionEntry
		demand float64
		floor  uint64
		want   uint64
		room   uint64 // left after the grant
	}{
		{"alone, unknown demand: the whole limit", nil, -1, 0, 100, 0},
		{"alone, a demand of 30", nil, 30, 0, 30, 70},
		{"alone, NaN: unknown", nil, math.NaN(), 0, 100, 0},
		{"alone, a demand past the limit", nil, math.Inf(1), 0, 100, 0},
		{"equal demands split evenly, whole units", others(80, 80), 80, 0, 33, 67},
		{"skewed: the big one gets what the small leave", others(10, 20), 200, 0, 70, 30},
		{"a small one gets its demand", others(90, 90), 10, 0, 10, 90},
		{"floors reserved for every region: the grant is past them", nil, -1, 10, 70, 0},
		{"a demand within its floor asks no grant", nil, 8, 10, 0, 70},
		{"a demand past its floor asks the rest", others(30, 30), 40, 10, 30, 40},
		{"another's grant is reserved, whatever its demand", map[string]regionEntry{"r0": {demand: 0, grant: 90, leaseEnd: live}}, 100, 0, 10, 0},
		{"another's held grant is reserved", map[string]regionEntry{"r0": {demand: 0, held: 60, leaseEnd: live}}, 100, 0, 40, 0},
		{"another's count past its floor is reserved", map[string]regionEntry{"r0": {demand: 0, count: 55, leaseEnd: live}}, 100, 5, 35, 0},
		{"a lease ended within a window: reserved, its demand not counted",
			map[string]regionEntry{"r0": {demand: 100, grant: 40, leaseEnd: epoch.Add(-30 * time.Second)}}, 100, 0, 60, 0},
		{"a lease ended a window and a lease ago: dropped",
			map[string]regionEntry{"r0": {demand: 100, grant: 40, leaseEnd: epoch.Add(-time.Minute - 2*time.Second)}}, 100, 0, 100, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newTestLimiter(t, epoch)
			seedRegions(c.m, tt.others)
			r := allowanceReq("me", tt.demand, 0, 0)
			r.Floor = tt.floor
			g := grant1(t, l, r)
			if g.Units != tt.want || g.Room != tt.room {
				t.Fatalf("grant %d, room %d; want %d, %d", g.Units, g.Room, tt.want, tt.room)
			}
			e := regionEntries(t, c.m)["me"]
			if e.grant != tt.want || !e.leaseEnd.Equal(epoch.Add(2*time.Second)) {
				t.Fatalf("own entry %+v, want grant %d, lease end now + 2 s", e, tt.want)
			}
			if _, ok := regionEntries(t, c.m)["r0"]; ok != (tt.others != nil && !strings.Contains(tt.name, "dropped")) {
				t.Fatalf("entries %v", regionEntries(t, c.m))
			}
		})
	}
}

// TestAllowanceHoldsWhatTheRegionDecidesWith: a region asking again
// reserves the grant it decides with until its next call, so that what it
// gives up goes to another region only once it stopped using it.
func TestAllowanceHoldsWhatTheRegionDecidesWith(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	if g := grant1(t, l, allowanceReq("a", 90, 0, 0)); g.Units != 90 {
		t.Fatalf("a: %d", g.Units)
	}
	c.add(time.Second)
	// a's demand falls; it still decides with 90 until this answer lands.
	if g := grant1(t, l, allowanceReq("a", 20, 0, 90)); g.Units != 20 {
		t.Fatalf("a, again: %d", g.Units)
	}
	if g := grant1(t, l, allowanceReq("b", 100, 0, 0)); g.Units != 10 {
		t.Fatalf("b while a holds 90: %d, want 10", g.Units)
	}
	c.add(time.Second)
	// a confirms it decides with 20, having counted 50 this window.
	grant1(t, l, allowanceReq("a", 20, 50, 20))
	if g := grant1(t, l, allowanceReq("b", 100, 0, 10)); g.Units != 50 {
		t.Fatalf("b while a counts 50: %d, want 50", g.Units)
	}
	c.add(time.Second)
	grant1(t, l, allowanceReq("a", 20, 20, 20))
	if g := grant1(t, l, allowanceReq("b", 100, 0, 50)); g.Units != 80 {
		t.Fatalf("b once a counts 20: %d, want 80", g.Units)
	}
}

// TestAllowanceNeverPassesTheLimit drives random regions (demands moving,
// answers lost, calls late and run after later ones, regions cut from the
// ledger, one region told a larger limit than the others, as a reload
// reaching it first would) deciding on sliding logs of their own,
// each with its floor plus the grant it holds while the grant's lease
// lives (counted from when it asked), and checks that the regions never
// admit more than the least limit in any window.
func TestAllowanceNeverPassesTheLimit(t *testing.T) {
	const window = 10 * time.Second
	for _, tc := range []struct{ limit, floor uint64 }{{1, 0}, {7, 0}, {100, 0}, {100, 10}, {600, 50}} {
		t.Run(fmt.Sprintf("%d/floor%d", tc.limit, tc.floor), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(tc.limit, tc.floor))
			l, c := newTestLimiter(t, epoch)
			type region struct {
				limit, floor uint64
				grant        uint64
				leaseEnd     time.Time
				log          []time.Time       // admissions
				late         *AllowanceRequest // a call that timed out here, still to run on the ledger
				turn         uint64
			}
			regions := make([]*region, 3)
			for i := range regions {
				regions[i] = &region{limit: tc.limit, floor: tc.floor}
			}
			// The last region was told a larger limit. (A larger floor counts
			// only from its first call: before it, the ledger knows nothing
			// of it; docs/regions.md says so.)
			regions[2].limit = tc.limit + tc.limit/4
			counted := func(r *region, now time.Time) uint64 {
				// The clock only moves on: what left the window is gone.
				r.log = slices.DeleteFunc(r.log, func(at time.Time) bool { return !at.After(now.Add(-window)) })
				return uint64(len(r.log))
			}
			for i := range 3000 {
				c.add(time.Duration(rng.IntN(400)) * time.Millisecond)
				r := regions[rng.IntN(len(regions))]
				if !c.now.Before(r.leaseEnd) {
					r.grant = 0
				}
				if r.late != nil && rng.IntN(3) == 0 { // the late call runs now; its answer is long gone
					grant1(t, l, *r.late)
					r.late = nil
					continue
				}
				if rng.IntN(3) == 0 { // ask the ledger
					demand := rng.Float64() * 1.5 * float64(r.limit)
					req := AllowanceRequest{
						Key: allowanceKey, Region: fmt.Sprint(regionIndex(regions, r)), Demand: demand,
						Count: counted(r, c.now), Current: r.grant, Limit: r.limit, Window: window,
						Lease: time.Duration(1+rng.IntN(3)) * time.Second, Floor: r.floor, Regions: len(regions),
					}
					r.turn++
					req.Turn = r.turn
					if r.late == nil && rng.IntN(10) == 0 { // timed out on its way: it runs later
						r.late = &req
						continue
					}
					sent := c.now
					g := grant1(t, l, req)
					if rng.IntN(8) != 0 { // else the answer is lost
						c.add(time.Duration(rng.IntN(100)) * time.Millisecond) // on its way
						r.grant, r.leaseEnd = g.Units, sent.Add(req.Lease)
					}
					continue
				}
				// Admit what the region's limit lets in, up to a burst.
				for range rng.IntN(int(tc.limit/4) + 2) {
					limit := r.floor
					if c.now.Before(r.leaseEnd) {
						limit += r.grant
					}
					if counted(r, c.now) >= limit {
						break
					}
					r.log = append(r.log, c.now)
				}
				var sum uint64
				for _, o := range regions {
					sum += counted(o, c.now)
				}
				if sum > tc.limit {
					t.Fatalf("step %d: the regions count %d in the last window, over the limit %d (%v)", i, sum, tc.limit, regionEntries(t, c.m))
				}
			}
		})
	}
}

func regionIndex[T comparable](list []T, v T) int {
	for i, e := range list {
		if e == v {
			return i
		}
	}
	return -1
}

func TestAllowanceErrors(t *testing.T) {
	l, _ := newTestLimiter(t, epoch)
	for _, r := range []AllowanceRequest{
		{Region: "a", Limit: 1, Window: time.Second, Lease: time.Second, Regions: 1},
		{Key: "k", Limit: 1, Window: time.Second, Lease: time.Second, Regions: 1},
		{Key: "k", Region: "a", Limit: 1, Window: time.Second, Lease: time.Second},
		{Key: "k", Region: "a", Limit: 1, Lease: time.Second, Regions: 1},
		{Key: "k", Region: "a", Limit: 1, Window: time.Second, Regions: 1},
		{Key: "k", Region: "a", Limit: 10, Window: time.Second, Lease: time.Second, Floor: 4, Regions: 3},
	} {
		if _, err := Allow(context.Background(), l, r); err == nil || strings.Contains(err.Error(), limiter.ErrStore.Error()) {
			t.Errorf("Allowance(%+v): %v, want a bad request", r, err)
		}
	}
}

// TestAllowanceLateCall: a call of a turn no later than one the ledger ran
// (one that timed out at the region and ran after a later one) is granted
// nothing and leaves the region's entry as the later call left it.
func TestAllowanceLateCall(t *testing.T) {
	l, c := newTestLimiter(t, epoch)
	early, later := allowanceReq("a", 30, 0, 0), allowanceReq("a", 90, 0, 0)
	if g := grant1(t, l, later); g.Units != 90 {
		t.Fatalf("the later call: %d", g.Units)
	}
	entry := c.m.HGet(allowanceKey, "a")
	if g := grant1(t, l, early); g.Units != 0 || c.m.HGet(allowanceKey, "a") != entry {
		t.Fatalf("the early call run late: granted %d, entry %q, want 0 and %q", g.Units, c.m.HGet(allowanceKey, "a"), entry)
	}
}
