package regions

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// The simulator of the promise across regions: one seed replays a whole
// schedule of hits, syncs, renewals, demand moving between regions, links
// to the ledger cut and healed and instances restarting, on a clock the
// simulator owns (every store is a miniredis on it, every instance reads
// it), and checks after every step that the regions together never count
// more than the limit in the last window (within a cut region's floor:
// when_cut share).
var (
	simSeed  = flag.Uint64("regions.seed", 0, "replay one schedule of TestRegionsSimulator (0: the suite's seeds)")
	simSteps = flag.Int("regions.steps", 200, "steps of each schedule of TestRegionsSimulator")
)

// simClock is the simulator's clock: every instance's Now and every
// store's Redis TIME.
type simClock struct {
	mu     sync.Mutex
	now    time.Time
	stores []*miniredis.Miniredis
}

func (c *simClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *simClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, m := range c.stores {
		m.SetTime(c.now)
	}
}

// simStore is a limiter on a fresh miniredis on the simulator's clock.
func (c *simClock) simStore(t *testing.T) (*limiter.Limiter, *miniredis.Miniredis) {
	t.Helper()
	m, _ := luastore.RunT(t)
	m.SetTime(c.Now())
	c.stores = append(c.stores, m)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	return l, m
}

// deadLedger is a limiter on a port that closes every connection it
// accepts: a region's link to the ledger, cut. (A port nothing listens on
// could be another test's store by the time it is dialled.)
func deadLedger(t *testing.T) *limiter.Limiter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close() // the cut: every call fails
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close() // ends the accept loop
		<-done
	})
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	return l
}

func TestRegionsSimulator(t *testing.T) {
	seeds := []uint64{1, 6, 7}
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	}
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			simulate(t, seed, *simSteps)
		})
	}
}

// simulate runs one schedule.
func simulate(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 44))
	const (
		window  = 10 * time.Second
		lease   = 2 * time.Second
		refresh = 200 * time.Millisecond
		regions = 3
	)
	limit := uint32(20 + rng.IntN(200))
	share := []float64{0, 0.05, 0.1, 0.3}[rng.IntN(4)]
	g := &config.Global{Share: share, WhenCut: []config.CutMode{config.CutShare, config.CutDeny}[rng.IntN(2)]}
	floor := int(share * float64(limit))
	clk := &simClock{now: time.Unix(1_700_006_400, 0)}
	ledger, _ := clk.simStore(t)
	dead := deadLedger(t)
	type instance struct {
		region int
		r      *Regions
	}
	var instances []*instance
	locals := make([]*limiter.Limiter, regions)
	cut := make([]bool, regions)
	start := func(region, n int) *instance {
		r, err := newRegions(decision.Direct(locals[region]), Options{Region: fmt.Sprint(region), Regions: regions,
			Instance: fmt.Sprintf("%d-%d", region, n), Ledger: ledger, Local: locals[region],
			Lease: lease, Refresh: refresh, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		r.inline = true
		if cut[region] {
			r.o.Ledger = dead
		}
		return &instance{region, r}
	}
	for region := range regions {
		locals[region], _ = clk.simStore(t)
		for n := range 2 {
			instances = append(instances, start(region, n))
		}
	}
	// Each region's admissions, for the oracle.
	admitted := make([][]time.Time, regions)
	demand := []float64{rng.Float64(), rng.Float64(), rng.Float64()}
	counted := func(region int) int {
		now := clk.Now()
		admitted[region] = slices.DeleteFunc(admitted[region], func(at time.Time) bool { return !at.After(now.Add(-window)) })
		return len(admitted[region])
	}
	var trace []string
	say := func(format string, args ...any) {
		trace = append(trace, fmt.Sprintf("%v ", clk.Now().Sub(time.Unix(1_700_006_400, 0)))+fmt.Sprintf(format, args...))
	}
	say("limit %d per %v, share %v (floor %d), when_cut %v", limit, window, share, floor, g.WhenCut)
	hit := decision.Request{
		Hits:   []limiter.Hit{{Key: "sim:{acme}", Algorithm: config.SlidingWindowLog, Limit: limit, Window: window, Cost: 1}},
		Routes: []decision.Route{{Global: g}},
	}
	for step := range steps {
		clk.add(time.Duration(rng.IntN(int(refresh/time.Millisecond)+50)) * time.Millisecond)
		switch x := rng.IntN(100); {
		case x < 55: // hits at one instance, by its region's demand
			in := instances[rng.IntN(len(instances))]
			n := int(demand[in.region] * float64(limit) / 4)
			ok := 0
			for range n {
				v, err := in.r.Decide(context.Background(), hit)
				if err != nil {
					t.Fatal(err)
				}
				if v[0].Admitted {
					admitted[in.region] = append(admitted[in.region], clk.Now())
					ok++
				}
			}
			say("region %d instance %s: %d hits, %d admitted", in.region, in.r.o.Instance, n, ok)
		case x < 85: // every instance syncs
			for _, in := range instances {
				in.r.syncAll()
			}
		case x < 91: // demand moves
			demand[rng.IntN(regions)] = rng.Float64() * 2
			say("demand %.2f", demand)
		case x < 96: // a region's link to the ledger is cut, or healed
			region := rng.IntN(regions)
			cut[region] = !cut[region]
			for _, in := range instances {
				if in.region == region {
					in.r.o.Ledger = map[bool]*limiter.Limiter{true: dead, false: ledger}[cut[region]]
				}
			}
			say("region %d cut %v", region, cut[region])
		default: // an instance restarts: what it knew is gone
			i := rng.IntN(len(instances))
			instances[i] = start(instances[i].region, step)
			say("region %d: instance restarted", instances[i].region)
		}
		sum := 0
		for region := range regions {
			sum += counted(region)
		}
		if sum > int(limit) {
			for _, line := range trace[max(0, len(trace)-40):] {
				t.Log(line)
			}
			t.Fatalf("seed %d step %d: the regions count %d in the last window, over the limit %d (replay: -regions.seed %d)",
				seed, step, sum, limit, seed)
		}
	}
	var total int
	for region := range regions {
		total += counted(region)
	}
	t.Logf("seed %d: limit %d, share %v, %d in the last window", seed, limit, share, total)
}
