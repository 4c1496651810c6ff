package regions

import (
	"context"
	"fmt"
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

// store is a limiter on a fresh miniredis, on the real clock (Redis TIME is
// the machine's, as the sync loop's).
func store(t *testing.T) (*limiter.Limiter, *miniredis.Miniredis) {
	t.Helper()
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	return l, m
}

// globalHit is a request of a hit of a global sliding log of limit per window.
func globalHit(g *config.Global, limit uint32, window time.Duration) decision.Request {
	return decision.Request{
		Hits:   []limiter.Hit{{Key: "test:{plan}_acme", Algorithm: config.SlidingWindowLog, Limit: limit, Window: window, Cost: 1}},
		Routes: []decision.Route{{Global: g}},
	}
}

// admission is an admitted hit: decided between sent and answered.
type admission struct{ sent, answered time.Time }

// overTheLimit returns the most admissions certainly within one window
// (sent at or after its start, answered by its end), over every window
// ending at an answer.
func mostInAWindow(all []admission, window time.Duration) int {
	most := 0
	for _, end := range all {
		n := 0
		for _, a := range all {
			if !a.sent.Before(end.answered.Add(-window)) && !a.answered.After(end.answered) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// TestRegionsShareOneLimit: three regions, each on its own store with two
// instances, and a ledger: demand at twice the limit all in one region,
// then at ten times it in another. The regions together never admit more
// than the limit in any window, and the region the demand moved to gets
// more than its floor.
func TestRegionsShareOneLimit(t *testing.T) {
	const (
		limit  = 60
		window = 2 * time.Second
	)
	ledger, _ := store(t)
	g := &config.Global{Share: 0.1, WhenCut: config.CutShare}
	type instance struct {
		region string
		r      *Regions
	}
	var instances []instance
	for _, region := range []string{"us", "eu", "ap"} {
		local, _ := store(t)
		for i := range 2 {
			r, err := New(decision.Direct(local), Options{Region: region, Regions: 3, Instance: fmt.Sprint(i), Ledger: ledger, Local: local,
				Lease: 400 * time.Millisecond, Refresh: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Close)
			instances = append(instances, instance{region, r})
		}
	}
	var mu sync.Mutex
	var all []admission
	beyondFloor := map[string]int{} // admissions past the floor's 6 in a window, per region, in the second half
	drive := func(region string, d, every time.Duration, half int) {
		var wg sync.WaitGroup
		for _, in := range instances {
			if in.region != region {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				pace := time.NewTicker(every)
				defer pace.Stop()
				stop := time.After(d)
				for {
					select {
					case <-stop:
						return
					case <-pace.C:
					}
					sent := time.Now()
					v, err := in.r.Decide(context.Background(), globalHit(g, limit, window))
					if err != nil {
						t.Error(err)
						return
					}
					if v[0].Admitted {
						mu.Lock()
						all = append(all, admission{sent, time.Now()})
						if half == 2 {
							beyondFloor[region]++
						}
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
	}
	// us at twice the limit's rate (each instance at the rate), then eu at
	// ten times it: what us counted in its last window must keep eu from
	// taking the grant us gives up until it no longer counts.
	drive("us", 3*window, window/limit, 1)
	drive("eu", 3*window, window/limit/5, 2)
	if most := mostInAWindow(all, window); most > limit {
		t.Errorf("%d admitted within a window across the regions, over the limit %d", most, limit)
	}
	// eu's floor is 6 a window: over three windows, more than 18 means it
	// was granted what us gave up.
	if beyondFloor["eu"] <= 18 {
		t.Errorf("eu admitted %d in three windows once the demand moved there: no more than its floor", beyondFloor["eu"])
	}
	t.Logf("%d admitted in all; most in a window %d; eu after the move %d", len(all), mostInAWindow(all, window), beyondFloor["eu"])
}
