package limiter

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

type entry struct {
	key, value string
	shared     bool
}

func buildKey(domain string, entries []entry, a config.Algorithm, w time.Duration) string {
	var b KeyBuilder
	b.Reset(domain)
	for _, e := range entries {
		if e.shared {
			b.AddShared(e.key, e.value)
		} else {
			b.Add(e.key, e.value)
		}
	}
	return b.Key(a, w)
}

func TestKeySchema(t *testing.T) {
	cases := []struct {
		domain  string
		entries []entry
		a       config.Algorithm
		w       time.Duration
		want    string
	}{
		{"api", []entry{{"remote_address", "10.0.0.1", false}}, config.SlidingWindowLog, time.Minute,
			"rl:{api|remote_address=10.0.0.1}:log:60"},
		{"api", []entry{{"path", "/login", false}, {"user", "alice", false}}, config.SlidingWindowCounter, time.Hour,
			"rl:{api|path=/login|user=alice}:counter:3600"},
		{"api", []entry{{"path", "/api/*", true}}, config.FixedWindow, time.Second,
			"rl:{api|path=*/api/%2A}:fixed:1"},
		{"a:b", []entry{{"k|{x}", "v=1 ü\x00", false}}, config.FixedWindow, time.Second,
			"rl:{a%3Ab|k%7C%7Bx%7D=v%3D1%20%C3%BC%00}:fixed:1"},
		// MaxKeyComponent bytes: escaped as it is; one more: its digest
		// (sha256sum | base64url, computed outside Go), in any component.
		{"api", []entry{{"k", strings.Repeat("a", 64), false}}, config.FixedWindow, time.Second,
			"rl:{api|k=" + strings.Repeat("a", 64) + "}:fixed:1"},
		{"api", []entry{{"k", strings.Repeat("a", 65), false}}, config.FixedWindow, time.Second,
			"rl:{api|k=#Y1NhxIu56rFBmOduqKt_GkFoXWrWKqkUbTAdTxfrCuA}:fixed:1"},
		{strings.Repeat("a", 65), []entry{{strings.Repeat("a", 65), "v", false}, {"p", strings.Repeat("a", 65), true}},
			config.SlidingWindowLog, time.Minute,
			"rl:{#Y1NhxIu56rFBmOduqKt_GkFoXWrWKqkUbTAdTxfrCuA|#Y1NhxIu56rFBmOduqKt_GkFoXWrWKqkUbTAdTxfrCuA=v" +
				"|p=*#Y1NhxIu56rFBmOduqKt_GkFoXWrWKqkUbTAdTxfrCuA}:log:60"},
		// Bytes that are not UTF-8, short and long.
		{"api", []entry{{"k", "\xff\xfe", false}}, config.FixedWindow, time.Second, "rl:{api|k=%FF%FE}:fixed:1"},
		{"api", []entry{{"k", strings.Repeat("\xff", 100), false}}, config.FixedWindow, time.Second,
			"rl:{api|k=#2m8UlwzjVs4BpbNAKR6diyZS62P7-PMoymqHpyf95Nk}:fixed:1"},
		// A short value that escapes to '#' never looks like a digest.
		{"api", []entry{{"k", "#Y1NhxIu56rFBmOduqKt_GkFoXWrWKqkUbTAdTxfrCuA", false}}, config.FixedWindow, time.Second,
			"rl:{api|k=%23Y1NhxIu56rFBmOduqKt_GkFoXWrWKqkUbTAdTxfrCuA}:fixed:1"},
	}
	for _, tc := range cases {
		if got := buildKey(tc.domain, tc.entries, tc.a, tc.w); got != tc.want {
			t.Errorf("key %q, want %q", got, tc.want)
		}
	}
}

// TestKeysAreInjective builds keys for many random descriptors drawn from the
// bytes that could confuse a naive schema and checks that two keys are equal
// only when their inputs are.
func TestKeysAreInjective(t *testing.T) {
	alphabet := []byte("a:_|{}=*%\x00 /")
	rng := rand.New(rand.NewPCG(1, 2))
	// Mostly 0-3 bytes; one in 8 is 60-67 bytes of two letters, around
	// MaxKeyComponent, where long ones are written as digests.
	str := func() string {
		n, alpha := rng.IntN(4), alphabet
		if rng.IntN(8) == 0 {
			n, alpha = 60+rng.IntN(8), alphabet[:2]
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = alpha[rng.IntN(len(alpha))]
		}
		return string(b)
	}
	seen := map[string]string{}
	for i := 0; i < 200_000; i++ {
		domain := str()
		entries := make([]entry, 1+rng.IntN(3))
		for j := range entries {
			entries[j] = entry{str(), str(), rng.IntN(4) == 0}
		}
		a := algorithms[rng.IntN(len(algorithms))]
		w := time.Duration(1+rng.IntN(2)) * time.Second
		id := strings.Join([]string{domain, a.String(), w.String()}, "\xff")
		for _, e := range entries {
			id += "\xfe" + e.key + "\xfd" + e.value
			if e.shared {
				id += "\xfc"
			}
		}
		key := buildKey(domain, entries, a, w)
		if prev, ok := seen[key]; ok && prev != id {
			t.Fatalf("key %q built from two inputs:\n%q\n%q", key, prev, id)
		}
		seen[key] = id
		if len(key) > 4*(3*MaxKeyComponent+2)+len("rl:{}:counter:2") {
			t.Fatalf("key %q: %d bytes, longer than its components allow", key, len(key))
		}
		// The hash tag spans the whole identity.
		if open, end := strings.IndexByte(key, '{'), strings.IndexByte(key, '}'); open != 3 || end != strings.LastIndexByte(key, '}') {
			t.Fatalf("key %q: hash tag does not span the identity", key)
		}
	}
}

func BenchmarkKeyBuilder(b *testing.B) {
	var kb KeyBuilder
	b.ReportAllocs()
	for b.Loop() {
		kb.Reset("api")
		kb.Add("path", "/v1/orders")
		kb.Add("user", "alice@example.com")
		_ = kb.Key(config.SlidingWindowLog, time.Minute)
	}
}
