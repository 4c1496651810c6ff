package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// clusterConfig has day windows throughout: a test that runs across no
// midnight (see avoidMidnight) sees one window per counter. The failover
// tests' fo_* rules take no slices: their load makes the keys hot, and a
// slice of ten seconds' demand would decide them through a failover
// quicker than that, so that no hit would meet the dead master.
const clusterConfig = `
domain: e2e
descriptors:
  - key: hot_log
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: sliding_window_log}
  - key: hot_counter
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: sliding_window_counter}
  - key: hot_fixed
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}
  - key: hot_gcra
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: gcra}
  - key: hot_reference
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: reference_fixed_window}
  - key: aon_log
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: aon_counter
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: aon_fixed
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: fixed_window}
  - key: aon_gcra
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: gcra}
  - key: aon_reference
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: reference_fixed_window}
  - key: aon_shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: ms_log
    rate_limit: {unit: day, requests_per_unit: 40, algorithm: sliding_window_log}
  - key: ms_counter
    rate_limit: {unit: day, requests_per_unit: 40, algorithm: sliding_window_counter}
  - key: ms_fixed
    rate_limit: {unit: day, requests_per_unit: 40, algorithm: fixed_window}
  - key: ms_gcra
    rate_limit: {unit: day, requests_per_unit: 40, algorithm: gcra}
  - key: ms_reference
    rate_limit: {unit: day, requests_per_unit: 40, algorithm: reference_fixed_window}
  - key: lat
    rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: fo_allow
    rate_limit: {unit: day, requests_per_unit: 1000000, failure_mode: allow, hot_key_slices: false}
  - key: fo_deny
    rate_limit: {unit: day, requests_per_unit: 1000000, failure_mode: deny, hot_key_slices: false}
  - key: fo_check
    rate_limit: {unit: day, requests_per_unit: 5, hot_key_slices: false}
`

// bigLimit is the fo_* rules' limit: never reached, so an OK answer with
// all of it remaining is the failure mode's, and any denial of fo_allow is
// wrong.
const bigLimit = 1000000

// algCodes are the algorithms as the key schema names them; "reference"
// is reference_fixed_window, keyed as envoyproxy/ratelimit keys.
var algCodes = []string{"log", "counter", "fixed", "gcra", "reference"}

// dayKey is the store key of descriptor (rule=value) in domain e2e under a
// day window, by the key schema (docs/stores.md): rl:{<domain>|<key>=<value>}:<alg>:<seconds>;
// for "reference", the reference's: <domain>_<key>_<value>_<today's start>.
func dayKey(rule, value, alg string) string {
	if alg == "reference" {
		return "e2e_" + rule + "_" + value + "_" + strconv.FormatInt(time.Now().Unix()/86400*86400, 10)
	}
	return "rl:{e2e|" + rule + "=" + value + "}:" + alg + ":86400"
}

// avoidMidnight waits past midnight UTC when less than margin is left
// before it: day windows would change under the test.
func avoidMidnight(t *testing.T, margin time.Duration) {
	t.Helper()
	if midnight := nextEdge(24 * time.Hour); time.Until(midnight) < margin {
		t.Logf("waiting %v for midnight UTC to pass", time.Until(midnight)+time.Second)
		waitUntil(midnight.Add(time.Second))
	}
}

// usage reads the units a counter holds directly on the master that serves
// its slot: the log's members (ZCARD), the current window's count of the
// counter and the fixed window, or the whole units a GCRA bucket lacks.
func (c *redisCluster) usage(t *testing.T, base string) int64 {
	t.Helper()
	ctx := context.Background()
	master := c.node(t, c.masterOf(t, base))
	switch {
	case strings.HasPrefix(base, "e2e_"): // the reference's plain integer
		n, err := master.client.Get(ctx, base).Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	case strings.Contains(base, ":log:"):
		n, err := master.client.ZCard(ctx, base).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	case strings.Contains(base, ":gcra:"):
		return gcraOwed(t, master.client, base, gcraLimits[strings.Split(base[strings.Index(base, "|")+1:], "=")[0]])
	}
	return windowCount(t, master.client, base)
}

// startClusterServers starts n instances of the service on cluster c. The
// tests' descriptor costs are request-time weights, which a denial must not
// charge, not costs reported after they were spent: --record-costs never.
func startClusterServers(t *testing.T, c *redisCluster, n int, storeTimeout string) []*server {
	t.Helper()
	servers := make([]*server, n)
	for i := range servers {
		// Every hit to the store: what these tests count and time is its path.
		servers[i] = startServer(t, nil, clusterConfig, "--redis-cluster-url", c.url(), "--store-timeout", storeTimeout, "--record-costs", "never",
			"--hot-key-threshold", "0")
	}
	return servers
}

func noFailureMode(t *testing.T, servers ...*server) {
	t.Helper()
	for i, s := range servers {
		if strings.Contains(s.logs.String(), "store unavailable") {
			t.Errorf("instance %d: a failure mode answered (store unavailable in its log)", i)
		}
	}
}

// TestClusterExactAcrossInstances: 200 clients spread over 3 instances of
// the service race for one key on a Redis Cluster; exactly the limit is
// admitted, and the key lives on the master that serves its slot.
func TestClusterExactAcrossInstances(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	servers := startClusterServers(t, c, 3, "2s")
	avoidMidnight(t, 30*time.Second)
	for i, key := range []string{"hot_log", "hot_counter", "hot_fixed", "hot_gcra", "hot_reference"} {
		t.Run(key, func(t *testing.T) {
			const clients, perClient, limit = 200, 3, 100
			var admitted, denied, failed atomic.Int64
			var wg sync.WaitGroup
			for cl := range clients {
				s := servers[cl%len(servers)]
				wg.Go(func() {
					for range perClient {
						resp, err := s.rls.ShouldRateLimit(context.Background(), request("e2e", descriptor(key, "one")))
						switch {
						case err != nil:
							failed.Add(1)
						case resp.OverallCode == ok:
							admitted.Add(1)
						default:
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			base := dayKey(key, "one", algCodes[i])
			stored := c.usage(t, base)
			t.Logf("%s: %d admitted, %d denied, %d errors; %d stored on %s (slot %d)",
				key, admitted.Load(), denied.Load(), failed.Load(), stored, c.masterOf(t, base), c.keySlot(t, base))
			if admitted.Load() != limit || failed.Load() != 0 {
				t.Fatalf("admitted %d with %d errors, want exactly %d and none", admitted.Load(), failed.Load(), limit)
			}
			if stored != limit {
				t.Fatalf("the master of %s holds %d units, want %d", base, stored, limit)
			}
		})
	}
	noFailureMode(t, servers...)
}

// TestClusterMultiSlotAllOrNothing: requests whose descriptors live on
// different masters are still decided all or nothing.
func TestClusterMultiSlotAllOrNothing(t *testing.T) {
	t.Parallel()
	// Proxied: the latency part delays the nodes; the rest runs with no
	// delay.
	c := startClusterWith(t, clusterOptions{proxied: true})
	s := startClusterServers(t, c, 1, "2s")[0]
	avoidMidnight(t, 90*time.Second)
	masters := c.masters(t)

	t.Run("one over its limit charges no other", func(t *testing.T) {
		for _, alg := range algCodes {
			rule := "aon_" + alg
			vals := c.spread(t, "a", func(v string) string { return dayKey(rule, v, alg) })
			full, b, cc := vals[0], vals[1], vals[2]
			for _, v := range vals {
				t.Logf("%s=%s: slot %d on %s", rule, v, c.keySlot(t, dayKey(rule, v, alg)), c.masterOf(t, dayKey(rule, v, alg)))
			}
			for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, ok, over} {
				if got := s.ask(t, request("e2e", descriptor(rule, full))).OverallCode; got != want {
					t.Fatalf("%s: filling %s, hit %d: %v, want %v", rule, full, i, got, want)
				}
			}
			for _, order := range [][]string{{full, b, cc}, {b, full, cc}, {b, cc, full}} {
				var ds []*rlcommon.RateLimitDescriptor
				for _, v := range order {
					ds = append(ds, descriptor(rule, v))
				}
				resp := s.ask(t, request("e2e", ds...))
				if resp.OverallCode != over {
					t.Fatalf("%s %v: %v, want OVER_LIMIT", rule, order, resp)
				}
				for i, v := range order {
					st := resp.Statuses[i]
					if v == full && st.Code != over {
						t.Fatalf("%s %v: the full counter %s answered %v", rule, order, v, st)
					}
					// Admissible, not charged: as on one Redis, all of
					// the limit is left.
					if v != full && (st.Code != ok || st.LimitRemaining != 3) {
						t.Fatalf("%s %v: %s answered %v, want OK with 3 remaining (not charged)", rule, order, v, st)
					}
				}
				// The refund lands just after the answer: wait for it, as
				// long as a busy machine may take to run it (the store
				// timeout, 2 s, bounds its call alone).
				for _, v := range []string{b, cc} {
					waitFor(t, 10*time.Second, func() error {
						if n := c.usage(t, dayKey(rule, v, alg)); n != 0 {
							return fmt.Errorf("%s %v: %s on %s holds %d after a denied request, want 0",
								rule, order, v, c.masterOf(t, dayKey(rule, v, alg)), n)
						}
						return nil
					})
				}
			}
			// A cost above its limit denies without a store call; the
			// descriptor on another master is not charged either.
			big := descriptor(rule, b)
			big.HitsAddend = wrapperspb.UInt64(4)
			if resp := s.ask(t, request("e2e", descriptor(rule, cc), big)); resp.OverallCode != over {
				t.Fatalf("%s: a cost above the limit beside another slot: %v", rule, resp)
			}
			// Checked through the service too: a cost-0 probe sees all
			// of the limit.
			probe := descriptor(rule, cc)
			probe.HitsAddend = wrapperspb.UInt64(0)
			if st := s.ask(t, request("e2e", probe)).Statuses[0]; st.Code != ok || st.LimitRemaining != 3 {
				t.Fatalf("%s: %s after denied requests: %v, want 3 remaining", rule, cc, st)
			}
			// And a request that fits is charged on every master.
			if resp := s.ask(t, request("e2e", descriptor(rule, b), descriptor(rule, cc))); resp.OverallCode != ok {
				t.Fatalf("%s: %s and %s: %v", rule, b, cc, resp)
			}
			for _, v := range vals {
				want := int64(1)
				if v == full {
					want = 3
				}
				if n := c.usage(t, dayKey(rule, v, alg)); n != want {
					t.Fatalf("%s: %s holds %d, want %d", rule, v, n, want)
				}
			}
		}
		// A shadow rule over its limit on one master neither denies nor
		// blocks the charge on another.
		shadow := c.spread(t, "s", func(v string) string { return dayKey("aon_shadow", v, "counter") })
		other := c.spread(t, "o", func(v string) string { return dayKey("aon_counter", v, "counter") })
		s.ask(t, request("e2e", descriptor("aon_shadow", shadow[0])))
		resp := s.ask(t, request("e2e", descriptor("aon_shadow", shadow[0]), descriptor("aon_counter", other[1])))
		if resp.OverallCode != ok {
			t.Fatalf("shadow over its limit beside another slot: %v", resp)
		}
		if n := c.usage(t, dayKey("aon_shadow", shadow[0], "counter")); n != 1 {
			t.Fatalf("shadow counter holds %d, want 1 (over its limit: not charged)", n)
		}
		if n := c.usage(t, dayKey("aon_counter", other[1], "counter")); n != 1 {
			t.Fatalf("the enforced descriptor beside a shadow denial holds %d, want 1", n)
		}
	})

	t.Run("concurrent multi-slot requests leave exactly the admitted", func(t *testing.T) {
		type counter struct {
			rule, value, key string
			master           int
		}
		var counters []counter
		for _, alg := range algCodes {
			rule := "ms_" + alg
			vals := c.spread(t, "m", func(v string) string { return dayKey(rule, v, alg) })
			for m, v := range vals {
				counters = append(counters, counter{rule, v, dayKey(rule, v, alg), m})
			}
		}
		const clients, perClient, limit = 40, 15, 40
		admittedUnits := make([]atomic.Int64, len(counters))
		var admitted, denied, failed, inconsistent, crossSlotDenials atomic.Int64
		var wg sync.WaitGroup
		for cl := range clients {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(cl), 7))
				for range perClient {
					// 2 to 4 distinct counters on at least 2 masters,
					// each with a cost of 1 or 2.
					var picked []int
					for {
						picked = rng.Perm(len(counters))[:2+rng.IntN(3)]
						onMasters := map[int]bool{}
						for _, p := range picked {
							onMasters[counters[p].master] = true
						}
						if len(onMasters) >= 2 {
							break
						}
					}
					costs := make([]uint64, len(picked))
					var ds []*rlcommon.RateLimitDescriptor
					for i, p := range picked {
						costs[i] = 1 + uint64(rng.IntN(2))
						d := descriptor(counters[p].rule, counters[p].value)
						d.HitsAddend = wrapperspb.UInt64(costs[i])
						ds = append(ds, d)
					}
					resp, err := s.rls.ShouldRateLimit(context.Background(), request("e2e", ds...))
					if err != nil {
						failed.Add(1)
						continue
					}
					overs := 0
					overOn, okOn := map[int]bool{}, map[int]bool{}
					for i, st := range resp.Statuses {
						if st.Code == over {
							overs++
							overOn[counters[picked[i]].master] = true
						} else {
							okOn[counters[picked[i]].master] = true
						}
					}
					// A denial with an admissible descriptor on another
					// master: that master's charge had to be refunded.
					for m := range okOn {
						if !overOn[m] && overs > 0 {
							crossSlotDenials.Add(1)
							break
						}
					}
					switch {
					case resp.OverallCode == ok && overs == 0:
						admitted.Add(1)
						for i, p := range picked {
							admittedUnits[p].Add(int64(costs[i]))
						}
					case resp.OverallCode == over && overs > 0:
						denied.Add(1)
					default:
						inconsistent.Add(1)
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%d requests: %d admitted, %d denied (%d of them with a descriptor that fit on another master: refunded), %d errors",
			clients*perClient, admitted.Load(), denied.Load(), crossSlotDenials.Load(), failed.Load())
		if failed.Load() != 0 || inconsistent.Load() != 0 {
			t.Fatalf("%d gRPC errors, %d answers whose overall code disagrees with their statuses", failed.Load(), inconsistent.Load())
		}
		if admitted.Load() == 0 || crossSlotDenials.Load() == 0 {
			t.Fatal("the load should both admit, and deny requests with descriptors that fit on other masters")
		}
		// Refunds land just after their answers: wait for the last ones.
		var report strings.Builder
		settled := time.Now()
		waitFor(t, 3*time.Second, func() error {
			report.Reset()
			var err error
			for i, cn := range counters {
				stored, want := c.usage(t, cn.key), admittedUnits[i].Load()
				fmt.Fprintf(&report, "\n  %s on %s: stored %d, admitted %d", cn.key, masters[cn.master], stored, want)
				if stored != want && err == nil {
					err = fmt.Errorf("%s holds %d units, admitted requests carried %d", cn.key, stored, want)
				}
				if want > limit {
					t.Fatalf("%s: %d units admitted, more than the limit %d", cn.key, want, limit)
				}
			}
			return err
		})
		if waited := time.Since(settled); waited > 100*time.Millisecond {
			t.Logf("the stored counts matched only after %v", waited)
		}
		t.Logf("per counter:%s", report.String())
		noFailureMode(t, s)
	})

	t.Run("descriptors on 3 masters cost one round trip", func(t *testing.T) {
		vals := c.spread(t, "l", func(v string) string { return dayKey("lat", v, "counter") })
		one := request("e2e", descriptor("lat", vals[0]))
		three := request("e2e", descriptor("lat", vals[0]), descriptor("lat", vals[1]), descriptor("lat", vals[2]))
		timed := func(req *rlsv3.RateLimitRequest) time.Duration {
			start := time.Now()
			if resp := s.ask(t, req); resp.OverallCode != ok {
				t.Fatalf("latency request denied: %v", resp)
			}
			return time.Since(start)
		}
		// medians alternates the two requests n times each.
		medians := func(n int) (time.Duration, time.Duration) {
			for range 5 {
				timed(one)
				timed(three)
			}
			var d1, d3 []time.Duration
			for range n {
				d1 = append(d1, timed(one))
				d3 = append(d3, timed(three))
			}
			slices.Sort(d1)
			slices.Sort(d3)
			return d1[n/2], d3[n/2]
		}
		m1, m3 := medians(200)
		// Logged, not asserted: on loopback a Redis round trip is a small
		// part of a request, and 3 descriptors cost 3 scripts of CPU, so
		// this ratio says more about the CPU than about round trips (and
		// moves with the machine's load).
		t.Logf("loopback: median %v with 1 descriptor, %v with 3 descriptors on 3 masters (%.2fx)", m1, m3, float64(m3)/float64(m1))
		// So the proxies add a delay to every command: 3 masters asked one
		// after the other would take 3 delays, at once 1. The delay is long
		// enough that the machine's load, beside the parallel tests, does
		// not pass for it (at 10 ms, 3 masters once took 15 ms more than 1).
		const delay = 50 * time.Millisecond
		c.setDelay(delay)
		defer c.setDelay(0)
		d1, d3 := medians(15)
		t.Logf("with %v added to each Redis command: median %v with 1 descriptor, %v with 3 descriptors on 3 masters "+
			"(%.2fx; one after the other would be about %v)",
			delay, d1, d3, float64(d3)/float64(d1), d1+2*delay)
		if d1 < delay {
			t.Fatalf("1 descriptor took %v, under the added %v: the proxies are not in the path", d1, delay)
		}
		// At once, 3 masters take what 1 does; one after the other, two
		// delays more. Judged nearer the second: beside the suite's other
		// tests one delayed command alone took 2.7 delays.
		if d3 >= d1+3*delay/2 {
			t.Errorf("3 masters take %v, 1 takes %v: the groups do not run at once", d3, d1)
		}
		for _, v := range vals {
			if n := c.usage(t, dayKey("lat", v, "counter")); n == 0 {
				t.Errorf("lat=%s on %s was never charged", v, c.masterOf(t, dayKey("lat", v, "counter")))
			}
		}
	})
}

// TestReferenceKeysOnACluster: a counter on envoyproxy/ratelimit's keys
// (reference_fixed_window), which have no hash tag, is reset, and leased
// by an RLQS fleet, on a Redis Cluster: neither call may touch a key on
// another slot, as the fleet's count (its key and ":rlqs-leased") and a
// slice's record (":slices") are. Each failed with CROSSSLOT, or a
// non-local key, when they did.
func TestReferenceKeysOnACluster(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	lim := limiter.New(c.client, &limiter.Options{Timeout: 10 * time.Second, DenyCache: -1})
	t.Cleanup(lim.Close)
	ctx := context.Background()
	kb := limiter.KeyBuilder{Now: time.Now()}
	kb.ResetReference("edge")
	kb.Add("ref", "alice")
	h := limiter.Hit{Key: kb.Key(config.ReferenceFixedWindow, time.Minute), Algorithm: config.ReferenceFixedWindow,
		Limit: 100, Window: time.Minute, Cost: 5}
	lease := h
	lease.Ahead = 12 * time.Second // an RLQS lease (internal/rlqs)
	for _, hit := range []limiter.Hit{h, lease} {
		if v, err := lim.Decide(ctx, []limiter.Hit{hit}); err != nil || !v[0].Charged {
			t.Fatalf("%+v: %+v, %v", hit, v, err)
		}
	}
	if _, err := lim.Reset(ctx, h); err != nil {
		t.Fatalf("Reset: %v", err)
	}
}
