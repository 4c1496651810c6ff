package limiter

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/pkg/config"
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
	str := func() string {
		b := make([]byte, rng.IntN(4))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
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
