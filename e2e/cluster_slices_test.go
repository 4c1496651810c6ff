package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestClusterSlices: 3 instances at their default flags, hot-key slices
// on, decide one key of each algorithm on a Redis Cluster: requests one
// after another until a slice is leased (at most 60), then 200 clients
// racing.
// Each key is leased (a counter's or GCRA's lease writes its record beside
// the count, a key the call names: docs/stores.md), Redis Cluster runs
// every call, no answer fails or comes by failure mode, and never more
// than the limit is admitted.
// Once the slices have ended and given back what they did not use, what
// is left is admitted to the limit exactly, never past it, and the master
// holds it.
func TestClusterSlices(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	var servers []*server
	for range 3 {
		servers = append(servers, startServer(t, nil, clusterConfig, "--redis-cluster-url", c.url()))
	}
	avoidMidnight(t, 150*time.Second) // each key's waits for give backs are bounded by 30 s
	for i, key := range []string{"hot_log", "hot_counter", "hot_fixed", "hot_gcra"} {
		t.Run(key, func(t *testing.T) {
			const clients, perClient, limit = 200, 3, 100
			leasedBefore := leased(t, servers)
			var admitted, failed atomic.Int64
			ask := func(s *server) {
				resp, err := s.rls.ShouldRateLimit(context.Background(), request("e2e", descriptor(key, "one")))
				switch {
				case err != nil:
					failed.Add(1)
				case resp.OverallCode == ok:
					admitted.Add(1)
				}
			}
			// One after another first, until a slice is leased: each answer
			// sizes the next slice by what is left, and a race decided in
			// one batch leaves none. Five in a row at each server make it
			// hot (3 hits in a second) unless a loaded machine's answers
			// take a third of a second; the race has 40 units or more left.
			for i := 0; admitted.Load() < 60; i++ {
				if i%5 == 0 && i >= 15 && leased(t, servers) > leasedBefore {
					break
				}
				ask(servers[(i/5)%len(servers)])
			}
			var wg sync.WaitGroup
			for cl := range clients {
				wg.Go(func() {
					for range perClient {
						ask(servers[cl%len(servers)])
					}
				})
			}
			wg.Wait()
			first := admitted.Load()
			// The slices end within a period and give back at a later
			// tick: ask until the limit is reached (or long past any tick
			// on a loaded machine), then once more, which must be denied.
			for end := time.Now().Add(30 * time.Second); admitted.Load() < limit && time.Now().Before(end); {
				before := admitted.Load()
				ask(servers[0])
				if admitted.Load() == before {
					time.Sleep(100 * time.Millisecond)
				}
			}
			ask(servers[0])
			base := dayKey(key, "one", algCodes[i])
			stored := c.usage(t, base)
			t.Logf("%s: %v units leased; %d admitted before the slices ended, %d in all, %d errors; %d stored",
				key, leased(t, servers)-leasedBefore, first, admitted.Load(), failed.Load(), stored)
			if failed.Load() != 0 || admitted.Load() != limit || stored != limit {
				t.Fatalf("admitted %d with %d errors, the master holding %d: want exactly %d, none, %d", admitted.Load(), failed.Load(), stored, limit, limit)
			}
			if leased(t, servers) == leasedBefore {
				t.Fatal("no slice leased: the case tests nothing")
			}
		})
	}
	noFailureMode(t, servers...)
}

// leased is the units the servers leased to slices so far.
func leased(t *testing.T, servers []*server) float64 {
	var n float64
	for _, s := range servers {
		n += metricSum(t, s, "ratelimit_hot_key_slice_units_total", `event="leased"`)
	}
	return n
}
