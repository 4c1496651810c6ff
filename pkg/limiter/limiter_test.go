package limiter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pkgconfig "github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
)

func TestAlgorithmNames(t *testing.T) {
	for _, tc := range []struct {
		alg  limiter.Algorithm
		name string
	}{
		{limiter.SlidingWindowLog, "sliding_window_log"},
		{limiter.SlidingWindowCounter, "sliding_window_counter"},
		{limiter.FixedWindow, "fixed_window"},
		{limiter.GCRA, "gcra"},
	} {
		if got := tc.alg.String(); got != tc.name {
			t.Errorf("%d.String() = %q, want %q", tc.alg, got, tc.name)
		}
		if got, err := limiter.ParseAlgorithm(tc.name); err != nil || got != tc.alg {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", tc.name, got, err, tc.alg)
		}
	}
	if _, err := limiter.ParseAlgorithm("reference_fixed_window"); err == nil {
		t.Error("reference_fixed_window: want an error (its keys need the service's clock)")
	}
}

// All or nothing: a request with one hit that does not fit charges none.
func TestDecideAllOrNothing(t *testing.T) {
	lim := embedded(t)
	ctx := context.Background()
	small := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1, Window: time.Hour}
	large := limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Window: time.Hour}
	first, err := lim.Decide(ctx, limiter.Hit{Key: "a", Limit: small, Cost: 1}, limiter.Hit{Key: "b", Limit: large, Cost: 1})
	if err != nil || !first[0].Admitted || !first[1].Admitted {
		t.Fatalf("first request: %+v, %v; want both admitted", first, err)
	}
	second, err := lim.Decide(ctx, limiter.Hit{Key: "a", Limit: small, Cost: 1}, limiter.Hit{Key: "b", Limit: large, Cost: 1})
	if err != nil || second[0].Admitted || !second[1].Admitted {
		t.Fatalf("second request: %+v, %v; want a denied, b fitting", second, err)
	}
	if second[1].Remaining != 9 {
		t.Errorf("b's remaining after a denied request = %d, want 9 (not charged)", second[1].Remaining)
	}
	if err := lim.Reset(ctx, "a", small.Algorithm); err != nil {
		t.Fatal(err)
	}
	if v, err := lim.Decide(ctx, limiter.Hit{Key: "a", Limit: small, Cost: 1}); err != nil || !v[0].Admitted {
		t.Errorf("after Reset: %+v, %v; want admitted", v, err)
	}
}

func TestShadowHitDoesNotDeny(t *testing.T) {
	lim := embedded(t)
	zero := limiter.Limit{Requests: 0, Window: time.Minute}
	v, err := lim.Decide(context.Background(), limiter.Hit{Key: "s", Limit: zero, Cost: 1, Shadow: true},
		limiter.Hit{Key: "t", Limit: limiter.Limit{Requests: 5, Window: time.Minute}, Cost: 1})
	if err != nil || v[0].Admitted || !v[1].Admitted {
		t.Fatalf("got %+v, %v; want the shadow hit denied and the other admitted", v, err)
	}
}

func TestInvalidHits(t *testing.T) {
	lim := embedded(t)
	for name, h := range map[string]limiter.Hit{
		"empty key":         {Limit: limiter.Limit{Requests: 1, Window: time.Second}},
		"no window":         {Key: "k", Limit: limiter.Limit{Requests: 1}},
		"fraction":          {Key: "k", Limit: limiter.Limit{Requests: 1, Window: 1500 * time.Millisecond}},
		"unknown algorithm": {Key: "k", Limit: limiter.Limit{Algorithm: 99, Requests: 1, Window: time.Second}},
	} {
		if v, err := lim.Decide(context.Background(), h); !errors.Is(err, limiter.ErrInvalid) || v != nil {
			t.Errorf("%s: %v, %v; want ErrInvalid and no verdicts", name, v, err)
		}
	}
}

// A store that cannot answer: the error wraps ErrStore and each hit is
// answered by its failure mode.
func TestStoreDownFailureModes(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	lim, err := limiter.New(client, &limiter.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	l := limiter.Limit{Requests: 5, Window: time.Minute}
	v, err := lim.Decide(context.Background(), limiter.Hit{Key: "open", Limit: l, Cost: 1},
		limiter.Hit{Key: "closed", Limit: l, Cost: 1, FailureMode: limiter.FailClosed})
	if !errors.Is(err, limiter.ErrStore) {
		t.Fatalf("err = %v, want ErrStore", err)
	}
	if len(v) != 2 || !v[0].Admitted || v[1].Admitted || !v[0].FromFailureMode || !v[1].FromFailureMode {
		t.Errorf("verdicts %+v: want the open hit admitted, the closed one denied, both by failure mode", v)
	}
}

func TestClosed(t *testing.T) {
	lim, err := limiter.NewEmbedded(nil)
	if err != nil {
		t.Fatal(err)
	}
	lim.Close()
	lim.Close() // again: nothing
	_, err = lim.Decide(context.Background(), limiter.Hit{Key: "k", Limit: limiter.Limit{Requests: 1, Window: time.Second}, Cost: 1})
	if !errors.Is(err, limiter.ErrClosed) || !errors.Is(err, limiter.ErrStore) {
		t.Errorf("after Close: %v, want ErrClosed wrapping ErrStore", err)
	}
}

func embedded(t *testing.T) *limiter.Limiter {
	t.Helper()
	lim, err := limiter.NewEmbedded(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	return lim
}

// New takes the clients it can decide on, and only when they do not retry.
func TestNewRefusesClients(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		ok     bool
	}{
		{"no retries", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}), true},
		{"cluster, no retries", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRetries: -1}), true},
		{"go-redis's default retries", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), false},
		{"a ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, MaxRetries: -1}), false},
	} {
		lim, err := limiter.New(tc.client, nil)
		if tc.ok != (err == nil) || !tc.ok && !errors.Is(err, limiter.ErrInvalid) {
			t.Errorf("%s: %v, want ok %v (else ErrInvalid)", tc.name, err, tc.ok)
		}
		if lim != nil {
			lim.Close()
		}
		_ = tc.client.Close() // never connected
	}
}

// A cost its limit can never hold is told so, rather than to wait.
func TestCostExceedsLimit(t *testing.T) {
	lim := embedded(t)
	v, err := lim.Decide(context.Background(), limiter.Hit{Key: "x", Limit: limiter.Limit{Requests: 5, Window: time.Minute}, Cost: 6})
	if err != nil || v[0].Admitted || !v[0].CostExceedsLimit {
		t.Errorf("cost 6 on a limit of 5: %+v, %v; want denied, CostExceedsLimit", v, err)
	}
}

// A rule's limit of calendar months has no Limit: one would count epoch
// windows of 30 days at another counter than the service's.
func TestLimitOfCalendar(t *testing.T) {
	cfg, err := pkgconfig.Parse("c.yaml", []byte(`domain: d
descriptors:
  - key: k
    rate_limit: {unit: month, requests_per_unit: 3, algorithm: fixed_window}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	rule, _ := cfg.Match("d", pkgconfig.Entry{Key: "k", Value: "v"})
	if _, err := limiter.LimitOf(rule.Limits()[0]); err == nil || !strings.Contains(err.Error(), "calendar") {
		t.Errorf("LimitOf a calendar month: %v, want an error", err)
	}
}
