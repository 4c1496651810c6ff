package limiter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// refKey is the reference's key of entries ("key=value", or "key=*pattern"
// for a share_threshold wildcard) at now.
func refKey(prefix, domain string, entries []string, window time.Duration, now time.Time) string {
	b := KeyBuilder{Prefix: prefix, Now: now}
	b.ResetReference(domain)
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		if pattern, ok := strings.CutPrefix(v, "*"); ok {
			b.AddShared(k, pattern)
			continue
		}
		b.Add(k, v)
	}
	return b.Key(config.ReferenceFixedWindow, window)
}

// TestReferenceKeySchema: the keys are envoyproxy/ratelimit's
// (src/limiter/cache_key.go: prefix, domain, "_", each key "_" value "_",
// the window's start in Unix seconds), byte for byte.
func TestReferenceKeySchema(t *testing.T) {
	now := time.Unix(1_700_000_123, 999_000_000) // a Tuesday, 22:15:23 UTC
	day := 24 * time.Hour
	cases := []struct {
		prefix, domain string
		entries        []string
		window         time.Duration
		want           string
	}{
		{"", "api", []string{"remote_address=10.0.0.1"}, time.Second, "api_remote_address_10.0.0.1_1700000123"},
		{"", "api", []string{"remote_address=10.0.0.1"}, time.Minute, "api_remote_address_10.0.0.1_1700000100"},
		{"", "api", []string{"path=/login", "user=alice"}, time.Hour, "api_path_/login_user_alice_1699999200"},
		{"", "api", []string{"k=v"}, day, "api_k_v_1699920000"},
		{"", "api", []string{"k=v"}, 7 * day, "api_k_v_1699488000"},
		{"", "api", []string{"k=v"}, 30 * day, "api_k_v_1697760000"},        // the reference's MONTH
		{"", "api", []string{"k=v"}, 365 * day, "api_k_v_1671408000"},       // its YEAR
		{"", "api", []string{"k=v"}, 7 * time.Minute, "api_k_v_1699999980"}, // unit_multiplier, an extension
		// CACHE_KEY_PREFIX (--key-prefix), as it is.
		{"edge:", "api", []string{"k=v"}, time.Minute, "edge:api_k_v_1700000100"},
		// share_threshold: the configured value, its '*' included.
		{"", "api", []string{"path=*files*", "user=bob"}, time.Minute, "api_path_files*_user_bob_1700000100"},
		// Nothing escaped, no hash tag added.
		{"", "a:b", []string{"k|{x}=v_1 ü"}, time.Minute, "a:b_k|{x}_v_1 ü_1700000100"},
	}
	for _, tc := range cases {
		if got := refKey(tc.prefix, tc.domain, tc.entries, tc.window, now); got != tc.want {
			t.Errorf("%q %q %v: key %q, want %q", tc.domain, tc.entries, tc.window, got, tc.want)
		}
	}
	// A builder started with Reset after a reference key builds ours again.
	b := KeyBuilder{Now: now}
	b.ResetReference("api")
	b.Add("k", "v")
	b.Key(config.ReferenceFixedWindow, time.Minute)
	b.Reset("api")
	b.Add("k", "v")
	if got, want := b.Key(config.FixedWindow, time.Minute), "rl:{api|k=v}:fixed:60"; got != want {
		t.Errorf("Reset after ResetReference: key %q, want %q", got, want)
	}
}

// TestReferenceFixedWindow runs the reference's counter through its cases on
// one key, in order, with Redis's clock and the key's both frozen.
func TestReferenceFixedWindow(t *testing.T) {
	start := epoch.Add(15 * time.Second) // 45 s before the minute ends
	l, c := newTestLimiter(t, start)
	key := refKey("", "test", []string{"k=u"}, time.Minute, start)
	if key != "test_k_u_1700006400" {
		t.Fatalf("key %q", key)
	}
	h := Hit{Key: key, Algorithm: config.ReferenceFixedWindow, Limit: 5, Window: time.Minute, Cost: 1}
	value := func() string {
		t.Helper()
		v, err := c.m.Get(key)
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return v
	}
	type step struct {
		name      string
		hit       func(Hit) Hit
		admitted  bool
		charged   bool
		remaining uint64
		reset     time.Duration
		value     string // the reference's plain integer after the step
	}
	same := func(h Hit) Hit { return h }
	cost := func(n uint64) func(Hit) Hit { return func(h Hit) Hit { h.Cost = n; return h } }
	recorded := func(n uint64) func(Hit) Hit { return func(h Hit) Hit { h.Cost, h.Record = n, true; return h } }
	refund := func(n uint64) func(Hit) Hit { return func(h Hit) Hit { h.Cost, h.Refund = n, true; return h } }
	steps := []step{
		{"first", same, true, true, 4, 45 * time.Second, "1"},
		{"check", cost(0), true, false, 4, 45 * time.Second, "1"},
		{"three", cost(3), true, true, 1, 45 * time.Second, "4"},
		{"last", same, true, true, 0, 45 * time.Second, "5"},
		{"denied, not counted", same, false, false, 0, 45 * time.Second, "5"},
		{"refund", refund(2), true, false, 2, 45 * time.Second, "3"},
		{"denied cost", cost(3), false, false, 2, 45 * time.Second, "3"},
		{"recorded past the limit", recorded(4), false, true, 0, 45 * time.Second, "7"},
		{"refund to the floor", refund(100), true, false, 5, 0, "0"},
		{"after the floor", cost(5), true, true, 0, 45 * time.Second, "5"},
	}
	for _, s := range steps {
		v := decide1(t, l, s.hit(h))
		if v.Admitted != s.admitted || v.Charged != s.charged || v.Remaining != s.remaining || v.ResetAfter != s.reset {
			t.Fatalf("%s: %+v; want admitted %t, charged %t, remaining %d, reset after %v",
				s.name, v, s.admitted, s.charged, s.remaining, s.reset)
		}
		if got := value(); got != s.value {
			t.Fatalf("%s: the key holds %q, want %q", s.name, got, s.value)
		}
	}
	// The key lives a whole window from its first write (the reference's
	// expiry, without its jitter), longer than its window.
	if ttl := c.m.TTL(key); ttl != time.Minute {
		t.Fatalf("TTL %v, want 1m", ttl)
	}

	// A count the reference made before (its INCRBY on its own key) counts.
	c.add(time.Minute)
	next := refKey("", "test", []string{"k=u"}, time.Minute, c.now)
	if next != "test_k_u_1700006460" {
		t.Fatalf("next window's key %q", next)
	}
	if _, err := c.m.Incr(next, 3); err != nil {
		t.Fatal(err)
	}
	h.Key = next
	for i, want := range []bool{true, true, false} {
		if v := decide1(t, l, h); v.Admitted != want {
			t.Fatalf("hit %d after the reference's 3: %+v, want admitted %t", i+1, v, want)
		}
	}
	if v, _ := c.m.Get(next); v != "5" {
		t.Fatalf("the new window's key holds %q, want 5", v)
	}
	// The reference's replicas renew the expiry: a key with one keeps it.
	if ttl := c.m.TTL(next); ttl != 0 {
		t.Fatalf("TTL %v of a key the reference made without one, want none kept", ttl)
	}
}

// TestReferenceWindowRollover: at the window's edge the key changes, and the
// new window admits the limit again, as the reference's fixed windows do;
// the old key keeps its count until it expires.
func TestReferenceWindowRollover(t *testing.T) {
	l, c := newTestLimiter(t, epoch.Add(-time.Second))
	admit := func(at time.Time) (admitted int, key string) {
		c.set(at)
		key = refKey("", "test", []string{"k=edge"}, 10*time.Second, at)
		h := Hit{Key: key, Algorithm: config.ReferenceFixedWindow, Limit: 3, Window: 10 * time.Second, Cost: 1}
		for range 5 {
			if decide1(t, l, h).Admitted {
				admitted++
			}
		}
		return admitted, key
	}
	before, old := admit(epoch.Add(-time.Second))
	after, current := admit(epoch)
	if before != 3 || after != 3 || old == current {
		t.Fatalf("admitted %d before the edge (key %s), %d after (key %s); want 3, 3 and two keys", before, old, after, current)
	}
	if v, _ := c.m.Get(old); v != "3" {
		t.Fatalf("the old window's key holds %q, want 3", v)
	}
}

// TestReferenceUndo: a charge refunded across slots (refund.lua) is taken
// back from the key it went to, never below zero.
func TestReferenceUndo(t *testing.T) {
	s := newShards(t, 2, epoch.Add(time.Second), nil)
	free := hitOn("free", 0, 2, config.ReferenceFixedWindow, 10, 3)
	full := hitOn("full", 1, 2, config.ReferenceFixedWindow, 2, 1)
	decide1(t, s.l, full)
	decide1(t, s.l, full)
	v, err := s.l.Decide(context.Background(), []Hit{free, full})
	if err != nil {
		t.Fatal(err)
	}
	if !v[0].Admitted || v[0].Charged || v[1].Admitted {
		t.Fatalf("verdicts %+v: want the free hit admitted but refunded, the full one denied", v)
	}
	s.l.refunds.Wait() // the refund runs after the answer
	if got, err := s.servers[0].Get(free.Key); err != nil || got != "0" {
		t.Fatalf("free key %s holds %q (%v) after the refund, want 0", free.Key, got, err)
	}
}
