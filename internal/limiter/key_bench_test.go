package limiter

import (
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// BenchmarkKeyBuilder (key_test.go) builds a key of plain values; these
// cover the other shapes Envoy sends.

// BenchmarkKeyBuilderEscaped builds a key whose values need escaping: an
// IPv6 remote address (':' becomes %3A) and a path with a query.
func BenchmarkKeyBuilderEscaped(b *testing.B) {
	var kb KeyBuilder
	b.ReportAllocs()
	for b.Loop() {
		kb.Reset("edge")
		kb.Add("remote_address", "2001:db8:85a3::8a2e:370:7334")
		kb.Add("path", "/v1/orders?id=42&x=y z")
		_ = kb.Key(config.SlidingWindowCounter, time.Minute)
	}
}

// BenchmarkKeyBuilderShared builds the key of a share_threshold wildcard.
func BenchmarkKeyBuilderShared(b *testing.B) {
	var kb KeyBuilder
	b.ReportAllocs()
	for b.Loop() {
		kb.Reset("api")
		kb.AddShared("path", "/files/*")
		kb.Add("user", "alice")
		_ = kb.Key(config.FixedWindow, time.Hour)
	}
}

// BenchmarkKeyBuilderRemoteAddress builds the most common key, one IPv4
// remote address, with a fresh builder per key as a request's first
// descriptor does.
func BenchmarkKeyBuilderRemoteAddress(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var kb KeyBuilder
		kb.Reset("edge")
		kb.Add("remote_address", "203.0.113.42")
		_ = kb.Key(config.SlidingWindowLog, time.Second)
	}
}

// BenchmarkKeyBuilderLongValue builds a key whose value is longer than
// MaxKeyComponent (a 1 KiB header copied into a descriptor): it is written
// as its SHA-256.
func BenchmarkKeyBuilderLongValue(b *testing.B) {
	var kb KeyBuilder
	long := string(make([]byte, 1024))
	b.ReportAllocs()
	for b.Loop() {
		kb.Reset("edge")
		kb.Add("user_agent", long)
		_ = kb.Key(config.SlidingWindowCounter, time.Minute)
	}
}
