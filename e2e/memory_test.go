package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// TestMemoryPerKey measures what a counter costs in Redis, per algorithm
// and limit: N counters of one domain are filled to their limit with hits of
// cost 1 (as traffic would), then their keys are weighed two ways: MEMORY
// USAGE (SAMPLES 0: every element) summed over every key the algorithm
// created, and the growth of INFO memory's used_memory; each divided by N.
// The table it logs is docs/stores.md's (Memory per key).
func TestMemoryPerKey(t *testing.T) {
	r := startRedis(t)
	ctx := context.Background()
	// No deny cache: the test empties Redis behind the limiter's back
	// (FLUSHALL between rows), which a cached denial cannot see.
	lim := limiter.New(r.client, &limiter.Options{Timeout: 10 * time.Second, DenyCache: -1})
	defer lim.Close()
	const n = 50
	const window = time.Minute
	algorithms := []struct {
		alg    config.Algorithm
		name   string
		maxTTL time.Duration // the longest a key may be kept
	}{
		{config.SlidingWindowLog, "sliding_window_log", window},
		{config.SlidingWindowCounter, "sliding_window_counter", 2 * window},
		{config.FixedWindow, "fixed_window", window},
		{config.GCRA, "gcra", window}, // a bucket of the limit refills in a window
	}
	// 200 for the log only: the first limit past Redis's compact encoding
	// of sorted sets (zset-max-listpack-entries 128).
	limits := []uint32{5, 100, 200, 1000}
	type row struct {
		algorithm      string
		limit          uint32
		keys           int
		usage, usedMem float64 // bytes per counter
		fillTook       time.Duration
	}
	var kb limiter.KeyBuilder
	counters := func(domain string, alg config.Algorithm, limit uint32) []limiter.Hit {
		hits := make([]limiter.Hit, n)
		for i := range hits {
			kb.Reset(domain)
			kb.Add("k", fmt.Sprintf("v%03d", i))
			hits[i] = limiter.Hit{Key: kb.Key(alg, window), Algorithm: alg, Limit: limit, Window: window, Cost: 1}
		}
		return hits
	}
	// measure fills n counters of alg to limit on an empty Redis and weighs
	// them.
	measure := func(name string, alg config.Algorithm, limit uint32, maxTTL time.Duration) row {
		// Equal-length names at every limit, so only the values differ.
		domain := fmt.Sprintf("m%04d", limit)
		hits := counters(domain, alg, limit)
		// The counters are epoch-aligned minutes: a fill across a minute's
		// edge would spread over two windows.
		awayFromEdge(window, 4*time.Second)
		// A request of the same shape on other keys first: the script is
		// loaded and the connection's buffers have grown before the
		// baseline.
		if _, err := lim.Decide(ctx, counters("w0000", alg, limit)); err != nil {
			t.Fatal(err)
		}
		if err := r.client.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		before := usedMemory(t, r.client)
		start := time.Now()
		for j := uint32(0); j < limit; j++ {
			verdicts, err := lim.Decide(ctx, hits)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range verdicts {
				if !v.Admitted || !v.Charged {
					t.Fatalf("%s limit %d: hit %d of counter %d not admitted: %+v", name, limit, j, i, v)
				}
			}
		}
		fillTook := time.Since(start)
		after := usedMemory(t, r.client)
		// Filled exactly: one more unit fits nowhere. (A GCRA bucket has
		// refilled a little during the fill.)
		verdicts, err := lim.Decide(ctx, hits)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range verdicts {
			if v.Admitted && alg != config.GCRA {
				t.Fatalf("%s limit %d: counter %d admits a unit past its limit: %+v", name, limit, i, v)
			}
		}

		// Every key the algorithm created: one per counter.
		keys := scanKeys(t, r.client, "rl:{"+domain+"|*")
		if len(keys) != n {
			t.Fatalf("%s limit %d: %d keys for %d counters: %v", name, limit, len(keys), n, keys[:min(len(keys), 5)])
		}
		var total int64
		for _, key := range keys {
			size, err := r.client.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			total += size
			ttl, err := r.client.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 0 || ttl > maxTTL {
				t.Fatalf("%s limit %d: key %s has TTL %v, want in (0, %v]", name, limit, key, ttl, maxTTL)
			}
		}
		perKey := float64(total) / n
		return row{name, limit, len(keys), perKey, float64(after-before) / n, fillTook}
	}

	// The first fill on a fresh Redis also grows its own structures (the
	// keyspace's tables, buffers): it is done once and not counted.
	measure(algorithms[0].name, algorithms[0].alg, limits[0], algorithms[0].maxTTL)
	var rows []row
	byUsage := map[string]map[uint32]float64{}
	for _, a := range algorithms {
		byUsage[a.name] = map[uint32]float64{}
		for _, limit := range limits {
			if limit == 200 && a.alg != config.SlidingWindowLog {
				continue
			}
			rw := measure(a.name, a.alg, limit, a.maxTTL)
			byUsage[a.name][limit] = rw.usage
			rows = append(rows, rw)
		}
	}

	var table strings.Builder
	table.WriteString("\n| algorithm | limit per minute | bytes per key (MEMORY USAGE) | bytes per key (used_memory delta) |\n" +
		"| --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&table, "| `%s` | %d | %.0f | %.0f |\n", r.algorithm, r.limit, r.usage, r.usedMem)
	}
	t.Logf("Redis %s, %d counters per row, each filled to its limit with hits of cost 1:%s", redisVersion(t, r.client), n, table.String())
	for _, r := range rows {
		t.Logf("%s limit %d filled in %v", r.algorithm, r.limit, r.fillTook.Round(time.Millisecond))
	}

	// The shapes. The counters hold a short string of window index and
	// counts, GCRA one instant: their size grows only with the digits.
	for _, name := range []string{"sliding_window_counter", "fixed_window", "gcra"} {
		lo, hi := byUsage[name][5], byUsage[name][5]
		for _, v := range byUsage[name] {
			lo, hi = min(lo, v), max(hi, v)
		}
		if hi-lo > 24 {
			t.Errorf("%s: %.0f to %.0f bytes per key across limits, want nearly constant (within 24 bytes)", name, lo, hi)
		}
		if hi > 200 {
			t.Errorf("%s: %.0f bytes per key, want a small constant", name, hi)
		}
	}
	// The log holds one member per unit: it grows linearly with the limit,
	// with a steeper slope once the set outgrows the compact listpack
	// encoding (128 members) for a skiplist.
	log := byUsage["sliding_window_log"]
	if !(log[5] < log[100] && log[100] < log[200] && log[200] < log[1000]) {
		t.Errorf("sliding_window_log: %v bytes per key at limits 5, 100, 200, 1000: want growing with the limit", log)
	}
	listpack := (log[100] - log[5]) / 95
	skiplist := (log[1000] - log[200]) / 800
	t.Logf("sliding_window_log: %.1f bytes per member up to 128 members (listpack), %.1f beyond (skiplist)", listpack, skiplist)
	if listpack < 8 || listpack > 60 {
		t.Errorf("sliding_window_log: %.1f bytes per member from limit 5 to 100, want 8 to 60", listpack)
	}
	if skiplist < 40 || skiplist > 200 {
		t.Errorf("sliding_window_log: %.1f bytes per member from limit 200 to 1000, want 40 to 200", skiplist)
	}
	if ratio := log[1000] / log[200]; ratio < 4 || ratio > 6 {
		t.Errorf("sliding_window_log: limit 1000 takes %.2fx the memory of limit 200, want about 5x (linear)", ratio)
	}
}

func usedMemory(t *testing.T, client *redis.Client) int64 {
	t.Helper()
	info, err := client.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, found := strings.CutPrefix(line, "used_memory:"); found {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no used_memory in INFO memory:\n%s", info)
	return 0
}

func redisVersion(t *testing.T, client *redis.Client) string {
	t.Helper()
	info, err := client.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, found := strings.CutPrefix(line, "redis_version:"); found {
			return v
		}
	}
	return "?"
}

// scanKeys lists the keys matching pattern with SCAN.
func scanKeys(t *testing.T, client *redis.Client, pattern string) []string {
	t.Helper()
	var keys []string
	iter := client.Scan(context.Background(), 0, pattern, 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}
