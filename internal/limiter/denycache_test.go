package limiter

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// newCachingLimiter runs on a miniredis that keeps real time, as the deny
// cache does.
func newCachingLimiter(t *testing.T, maxAge time.Duration) (*Limiter, *miniredis.Miniredis) {
	t.Helper()
	m, _ := luastore.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: maxAge})
	t.Cleanup(l.Close)
	return l, m
}

func TestDeniedHitsAreAnsweredFromMemory(t *testing.T) {
	l, m := newCachingLimiter(t, time.Second)
	full := hit(config.SlidingWindowLog, "full", 2, time.Hour, 1)
	decide1(t, l, full)
	decide1(t, l, full)
	denied := decide1(t, l, full) // Redis denies: the wait is about an hour
	if denied.Admitted {
		t.Fatal("a third hit on a limit of 2 was admitted")
	}
	before := m.CommandCount()
	cached := decide1(t, l, full)
	if n := m.CommandCount() - before; n != 0 {
		t.Fatalf("%d store commands for a hit Redis just denied, want none", n)
	}
	if cached.Admitted || cached.ResetAfter < denied.ResetAfter-time.Second || cached.ResetAfter > denied.ResetAfter {
		t.Fatalf("cached verdict %+v: want a denial with Redis's own wait (%v) counting down, not the cache's 1s", cached, denied.ResetAfter)
	}

	// Not covered: a smaller cost (it may fit), a larger one (it waits
	// longer), another limit (a reload), a shadow hit.
	for _, h := range []Hit{
		hit(config.SlidingWindowLog, "full", 2, time.Hour, 0),
		hit(config.SlidingWindowLog, "full", 2, time.Hour, 2),
		hit(config.SlidingWindowLog, "full", 3, time.Hour, 1),
		func() Hit { h := full; h.Shadow = true; return h }(),
	} {
		before := m.CommandCount()
		decide1(t, l, h)
		if m.CommandCount() == before {
			t.Errorf("hit %+v answered from memory, want Redis asked", h)
		}
	}
	// A reset forgets.
	if _, err := l.Reset(context.Background(), full); err != nil {
		t.Fatal(err)
	}
	if v := decide1(t, l, full); !v.Admitted {
		t.Fatalf("after Reset: %+v", v)
	}
}

func TestDeniedHitsAreForgottenAfterMaxAge(t *testing.T) {
	l, m := newCachingLimiter(t, 100*time.Millisecond)
	full := hit(config.FixedWindow, "full", 1, time.Hour, 1)
	decide1(t, l, full)
	decide1(t, l, full) // denied, cached for 100ms
	// 150ms pass for the cache: it keeps times since its base, so moving the
	// base back ages every entry (no call runs meanwhile).
	l.denied.base = l.denied.base.Add(-150 * time.Millisecond)
	before := m.CommandCount()
	decide1(t, l, full)
	if m.CommandCount() == before {
		t.Fatal("a denial was repeated from memory past the cache's bound")
	}
}

// TestACachedDenialChargesNothingElse: all or nothing holds when the denial
// comes from memory; the other hits are checked, not charged.
func TestACachedDenialChargesNothingElse(t *testing.T) {
	l, _ := newCachingLimiter(t, time.Second)
	full := hit(config.FixedWindow, "full", 1, time.Hour, 1)
	other := hit(config.FixedWindow, "other", 10, time.Hour, 1)
	decide1(t, l, full)
	decide1(t, l, full)
	v, err := l.Decide(context.Background(), []Hit{other, full})
	if err != nil || v[1].Admitted || !v[0].Admitted || v[0].Charged || v[0].Remaining != 10 {
		t.Fatalf("verdicts %+v, %v: want the other hit checked (10 left), not charged", v, err)
	}
}

// cacheBytes ages every shard to at and returns the bytes accounted.
func cacheBytes(c *denyCache, at time.Time) int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.age(c.since(at), int64(c.maxAge))
		n += s.curBytes + s.prevBytes
		s.mu.Unlock()
	}
	return n
}

// denyHit is a hit on key with a limit of 10.
func denyHit(key string, cost uint64) Hit {
	return Hit{Key: key, Algorithm: config.FixedWindow, Limit: 10, Window: time.Minute, Cost: cost}
}

// TestDenyCacheAnswersOnlyTheSameDemand: a cached denial answers the same
// limit and cost, with Redis's wait counting down, until that wait or
// maxAge, whichever comes first.
func TestDenyCacheAnswersOnlyTheSameDemand(t *testing.T) {
	t0 := time.Now()
	c := newDenyCacheSized(time.Second, 1<<20)
	c.remember(denyHit("k", 3), Verdict{Remaining: 2, ResetAfter: 5 * time.Second}, t0)
	c.remember(denyHit("soon", 3), Verdict{Remaining: 2, ResetAfter: 300 * time.Millisecond}, t0)
	for _, tt := range []struct {
		name string
		h    Hit
		at   time.Duration
		want bool
		wait time.Duration
	}{
		{"same cost", denyHit("k", 3), 200 * time.Millisecond, true, 4800 * time.Millisecond},
		{"lighter cost: may fit", denyHit("k", 2), 0, false, 0},
		{"heavier cost: waits longer", denyHit("k", 4), 0, false, 0},
		{"another limit", Hit{Key: "k", Limit: 11, Cost: 3}, 0, false, 0},
		{"a burst on another algorithm: no bucket", func() Hit { h := denyHit("k", 3); h.Burst = 20; return h }(), 0, true, 5 * time.Second},
		{"another key", denyHit("other", 3), 0, false, 0},
		{"just before maxAge", denyHit("k", 3), 999 * time.Millisecond, true, 4001 * time.Millisecond},
		{"at maxAge", denyHit("k", 3), time.Second, false, 0},
		{"before Redis's wait", denyHit("soon", 3), 299 * time.Millisecond, true, time.Millisecond},
		{"at Redis's wait", denyHit("soon", 3), 300 * time.Millisecond, false, 0},
	} {
		v, ok := c.lookup(tt.h, t0.Add(tt.at))
		if ok != tt.want || (ok && (v.Admitted || v.Remaining != 2 || v.ResetAfter != tt.wait)) {
			t.Errorf("%s: %+v %v, want found=%v with %v to wait", tt.name, v, ok, tt.want, tt.wait)
		}
	}
}

// TestDenyCacheWithGCRA: a GCRA denial is repeated from memory with its
// exact wait counting down, for the same bucket only.
func TestDenyCacheWithGCRA(t *testing.T) {
	l, m := newCachingLimiter(t, time.Minute)
	m.SetTime(time.Now())
	h := gcraHit("g", 60, time.Hour, 2, 1) // one unit a minute, a bucket of 2
	decide1(t, l, h)
	decide1(t, l, h)
	denied := decide1(t, l, h)
	if denied.Admitted || denied.ResetAfter != time.Minute {
		t.Fatalf("third hit: %+v, want denied for exactly a minute", denied)
	}
	before := m.CommandCount()
	if v := decide1(t, l, h); v.Admitted || v.ResetAfter > time.Minute || v.ResetAfter <= 0 || m.CommandCount() != before {
		t.Fatalf("repeat: %+v with %d store commands, want a cached denial counting down from a minute", v, m.CommandCount()-before)
	}
	bigger := gcraHit("g", 60, time.Hour, 3, 1) // a reload made the bucket 3
	if v := decide1(t, l, bigger); !v.Admitted || m.CommandCount() == before {
		t.Fatalf("a larger bucket: %+v, want Redis asked and the hit admitted", v)
	}
}

func TestDenyCacheForget(t *testing.T) {
	t0 := time.Now()
	c := newDenyCacheSized(time.Second, 1<<20)
	c.remember(denyHit("k", 1), Verdict{ResetAfter: time.Minute}, t0)
	c.remember(denyHit("k", 1), Verdict{ResetAfter: time.Minute}, t0) // replaced, counted once
	if got, want := cacheBytes(c, t0), len("k")+denyEntryOverhead; got != want {
		t.Fatalf("%d bytes for one entry remembered twice, want %d", got, want)
	}
	c.forget("k")
	if _, ok := c.lookup(denyHit("k", 1), t0); ok {
		t.Fatal("a forgotten denial answered")
	}
	if got := cacheBytes(c, t0); got != 0 {
		t.Fatalf("%d bytes after forget, want 0", got)
	}
}

// TestDenyCacheDropsExpiredEntries: once every entry has expired, the next
// use of each shard frees its memory.
func TestDenyCacheDropsExpiredEntries(t *testing.T) {
	t0 := time.Now()
	c := newDenyCacheSized(time.Second, 64<<20)
	for i := range 10_000 {
		c.remember(denyHit(fmt.Sprint("key-", i), 1), Verdict{ResetAfter: time.Hour}, t0.Add(time.Duration(i)*50*time.Microsecond))
	}
	if got := cacheBytes(c, t0.Add(time.Second)); got == 0 {
		t.Fatal("nothing held at maxAge after the first entry")
	}
	if got := cacheBytes(c, t0.Add(2*time.Second)); got == 0 {
		t.Fatal("nothing held 2 s in: the entries of the last 0.5 s live until 1.5 s in, ages are per shard")
	}
	// The last entry was sent at 0.5 s and expired at 1.5 s: after two
	// generations of a second, all are gone.
	if got := cacheBytes(c, t0.Add(3*time.Second)); got != 0 {
		t.Fatalf("%d bytes held 3 s in, after every entry expired", got)
	}
	for i := range c.shards {
		if s := &c.shards[i]; len(s.cur)+len(s.prev) != 0 {
			t.Fatalf("shard %d holds %d+%d entries", i, len(s.cur), len(s.prev))
		}
	}
	// A generation is never dropped while an entry in it can still answer.
	c.remember(denyHit("late", 1), Verdict{ResetAfter: time.Hour}, t0.Add(3*time.Second+900*time.Millisecond))
	for _, at := range []time.Duration{4 * time.Second, 4500 * time.Millisecond, 4899 * time.Millisecond} {
		if _, ok := c.lookup(denyHit("late", 1), t0.Add(at)); !ok {
			t.Fatalf("an entry sent at 3.9 s, live until 4.9 s, was gone at %v", at)
		}
	}
}

// TestDenyCacheBoundInBytes: a flood of distinct denied keys, long and
// short, never holds more than the bound, and the newest entries answer.
func TestDenyCacheBoundInBytes(t *testing.T) {
	t0 := time.Now()
	const maxBytes = 256 << 10
	c := newDenyCacheSized(time.Minute, maxBytes)
	for i := range 20_000 {
		key := fmt.Sprintf("key-%d-%s", i, strings.Repeat("v", i%700))
		at := t0.Add(time.Duration(i) * time.Microsecond)
		c.remember(denyHit(key, 1), Verdict{ResetAfter: time.Hour}, at)
		if _, ok := c.lookup(denyHit(key, 1), at); !ok {
			t.Fatalf("entry %d (%d bytes of key) not answered right after it was remembered", i, len(key))
		}
		if i%1000 == 0 {
			if got := cacheBytes(c, at); got > maxBytes {
				t.Fatalf("after %d entries: %d bytes accounted, more than %d", i+1, got, maxBytes)
			}
		}
	}
	// A key larger than a shard's share is not kept at all.
	huge := strings.Repeat("k", maxBytes/denyShards)
	c.remember(denyHit(huge, 1), Verdict{ResetAfter: time.Hour}, t0)
	if _, ok := c.lookup(denyHit(huge, 1), t0); ok {
		t.Fatal("a key larger than its shard's bound was kept")
	}
}

// TestDenyCacheRetainedBytes measures what an entry really keeps on the heap
// beyond its key's length (runtime.MemStats after a GC, with the maps at
// their fullest and their emptiest load) and checks that denyEntryOverhead
// accounts for at least that.
func TestDenyCacheRetainedBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates and collects repeatedly")
	}
	t0 := time.Now()
	for _, keyLen := range []int{40, 200} {
		// 16 shards of maps that double: counts around a growth, so both the
		// fullest and the emptiest maps are measured.
		for _, n := range []int{16 * 1024 * 7 / 8, 16*1024*7/8 + 16*64} {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("%0*d", keyLen, i) // built before measuring
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c := newDenyCacheSized(time.Minute, 1<<30)
			for _, k := range keys {
				// A fresh copy, as KeyBuilder.Key makes per request: the
				// cache is what keeps it alive.
				c.remember(denyHit(strings.Clone(k), 1), Verdict{ResetAfter: time.Hour}, t0)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perEntry := (int64(after.HeapAlloc)-int64(before.HeapAlloc))/int64(n) - int64(keyLen)
			t.Logf("%d-byte keys, %d entries: %d bytes retained per entry beyond the key, %d accounted",
				keyLen, n, perEntry, denyEntryOverhead)
			if perEntry > denyEntryOverhead {
				t.Errorf("%d-byte keys, %d entries: %d bytes per entry beyond the key, more than the %d accounted",
					keyLen, n, perEntry, denyEntryOverhead)
			}
			runtime.KeepAlive(c)
			runtime.KeepAlive(keys)
		}
	}
}

// TestDenyCacheRunsOnOptionsNow: the deny cache reads Options.Now, so a test
// freezes it: a cached denial repeats Redis's wait exactly while the clock
// stands, and past maxAge on that clock Redis is asked again.
func TestDenyCacheRunsOnOptionsNow(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	now := epoch
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: time.Second, Now: func() time.Time { return now }})
	defer l.Close()
	full := hit(config.FixedWindow, "full", 1, time.Minute, 1)
	decide1(t, l, full)
	denied := decide1(t, l, full)
	if denied.Admitted || denied.ResetAfter != time.Minute {
		t.Fatalf("second hit %+v, want denied for the minute", denied)
	}
	before := m.CommandCount()
	if v := decide1(t, l, full); v.Admitted || v.ResetAfter != denied.ResetAfter || m.CommandCount() != before {
		t.Fatalf("with the clock frozen: %+v after %d store commands, want Redis's own wait from memory", v, m.CommandCount()-before)
	}
	now = now.Add(time.Second) // maxAge on the injected clock; Redis's stands still
	if v := decide1(t, l, full); v.Admitted || m.CommandCount() == before {
		t.Fatalf("past maxAge: %+v, want Redis asked (and denying)", v)
	}
}
