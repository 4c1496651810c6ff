package envoyrlqs

import (
	"maps"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
)

// TestTokenBucketArithmetic runs Envoy's AtomicTokenBucketImpl arithmetic on
// a clock the steps move: each step advances it, then makes requests at
// instants `each` apart (0: all at one instant), the clock left at the last.
func TestTokenBucketArithmetic(t *testing.T) {
	type step struct {
		advance  time.Duration
		requests int
		each     time.Duration
		allowed  int
	}
	const year = 365 * 24 * time.Hour
	cases := []struct {
		name  string
		max   uint32
		fill  uint32
		every *durationpb.Duration
		steps []step
	}{
		{"starts full", 5, 1, durationpb.New(time.Second), []step{{0, 7, 0, 5}}},
		{"refills tokens_per_fill per whole fill_interval, continuously", 5, 2, durationpb.New(4 * time.Second),
			[]step{{0, 5, 0, 5}, {time.Second, 1, 0, 0}, {time.Second, 2, 0, 1}, {2 * time.Second, 1, 0, 1}}},
		{"capped at max_tokens", 3, 10, durationpb.New(time.Second), []step{{0, 3, 0, 3}, {100 * time.Second, 5, 0, 3}}},
		{"fill_interval truncated to whole seconds (1.5s is 1s)", 8, 4, durationpb.New(1500 * time.Millisecond),
			[]step{{0, 8, 0, 8}, {time.Second, 5, 0, 4}}},
		{"fill_interval under 1s: +Inf rate, one request a distinct instant, max_tokens no bound", 2, 5, durationpb.New(500 * time.Millisecond),
			[]step{{0, 3, 0, 0}, {time.Millisecond, 100, time.Nanosecond, 100}, {0, 2, 0, 0}}},
		{"tokens_per_fill and fill_interval unset: NaN rate admits everything", 2, 0, nil, []step{{0, 50, 0, 50}}},
		{"NaN rate with max_tokens 0 still denies", 0, 0, nil, []step{{time.Second, 5, 0, 0}}},
		{"tokens_per_fill 0: max_tokens, then one token a year", 3, 0, durationpb.New(time.Second),
			[]step{{0, 5, 0, 3}, {24 * time.Hour, 1, 0, 0}, {year + 24*time.Hour, 2, 0, 1}}},
		{"max_tokens 0 denies all", 0, 1, durationpb.New(time.Second), []step{{0, 1, 0, 0}, {10 * time.Second, 3, 0, 0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := 0.0
			b := newTokenBucket(tokenBucketProto(tc.max, tc.fill, tc.every), now)
			for i, s := range tc.steps {
				now += s.advance.Seconds()
				allowed := 0
				for j := range s.requests {
					if j > 0 {
						now += s.each.Seconds()
					}
					if b.consume(now) {
						allowed++
					}
				}
				if allowed != s.allowed {
					t.Fatalf("step %d: %d of %d allowed, want %d", i, allowed, s.requests, s.allowed)
				}
			}
		})
	}
}

func TestTokenBucketRemaining(t *testing.T) {
	b := newTokenBucket(tokenBucketProto(4, 1, durationpb.New(2*time.Second)), 10)
	if got := b.remaining(10); got != 4 {
		t.Fatalf("new bucket holds %v, want 4", got)
	}
	for range 4 {
		b.consume(10)
	}
	if got := b.remaining(11); got != 0.5 {
		t.Fatalf("after 1s at 0.5/s it holds %v, want 0.5", got)
	}
	if got := b.remaining(100); got != 4 {
		t.Fatalf("long after it holds %v, want the cap 4", got)
	}
}

// TestDurationReadings: how Envoy reads the durations it truncates.
func TestDurationReadings(t *testing.T) {
	whole := []struct {
		s    int64
		n    int32
		want int64
	}{{1, 500_000_000, 1}, {0, 999_999_999, 0}, {2, 0, 2}, {1, -1, 0}, {-1, 1, 0}, {-2, -5, -2}}
	for _, tc := range whole {
		if got := wholeSeconds(tc.s, tc.n); got != tc.want {
			t.Errorf("wholeSeconds(%d, %d) = %d, want %d", tc.s, tc.n, got, tc.want)
		}
	}
	ttl := []struct {
		d    *durationpb.Duration
		want time.Duration
	}{
		{nil, 0},
		{&durationpb.Duration{Nanos: 999_999_999}, 0},
		{&durationpb.Duration{Seconds: 1, Nanos: 999_999_999}, time.Second},
		{&durationpb.Duration{Seconds: -3}, 0},
		{&durationpb.Duration{Seconds: 10}, 10 * time.Second},
		{&durationpb.Duration{Seconds: math.MaxInt64}, math.MaxInt64},
	}
	for _, tc := range ttl {
		if got := secondsOnly(tc.d.GetSeconds()); got != tc.want {
			t.Errorf("TTL %v read as %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestAppendKey(t *testing.T) {
	same := [][2]map[string]string{
		{{"a": "1", "b": "2"}, {"b": "2", "a": "1"}},
		{{}, nil},
	}
	for _, p := range same {
		if bucketKey(p[0]) != bucketKey(p[1]) {
			t.Errorf("%v and %v give different keys", p[0], p[1])
		}
	}
	differ := [][2]map[string]string{
		{{"a": "bc"}, {"ab": "c"}},
		{{"a": "1"}, {"a": "1", "b": ""}},
		{{"a": "1", "b": "2"}, {"a": "2", "b": "1"}},
	}
	for _, p := range differ {
		if bucketKey(p[0]) == bucketKey(p[1]) {
			t.Errorf("%v and %v give the same key", p[0], p[1])
		}
	}
	many := map[string]string{}
	for i := range 40 {
		many[string(rune('a'+i))] = "v"
	}
	if bucketKey(many) != bucketKey(maps.Clone(many)) {
		t.Error("a bucket id of 40 keys (sorted on the heap) gives unstable keys")
	}
}
