package envoyrlqs

import (
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// started returns a client whose bucket b1 exists, on a server that has its
// first report.
func started(t *testing.T, opts Options) (*env, *Client) {
	t.Helper()
	e := newEnv(t)
	if opts.ReportInterval == 0 {
		opts.ReportInterval = time.Hour
	}
	c := e.client(opts)
	c.Allow(b1)
	wait(t, "b1's first report", func() bool { return len(e.srv.all()) >= 1 })
	return e, c
}

// apply pushes one action and waits until the client has taken or ignored it.
func apply(t *testing.T, e *env, c *Client, a *rlqspb.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	before := c.Stats()
	e.srv.push(t, a)
	wait(t, "the action handled", func() bool {
		s := c.Stats()
		return s.ActionsApplied+s.ActionsIgnored > before.ActionsApplied+before.ActionsIgnored
	})
}

func drain(c *Client, bucket map[string]string) (allowed int) {
	for c.Allow(bucket) {
		allowed++
	}
	return allowed
}

// TestTokenBucketKeptOrReplaced: one bucket's successive assignments on a
// frozen clock. An equal token bucket (protoTokenBucketsEq: max_tokens,
// tokens_per_fill, fill_interval.nanos) keeps the limiter, drained as it is;
// a different one, or one after a blanket rule, is a new limiter, full.
func TestTokenBucketKeptOrReplaced(t *testing.T) {
	e, c := started(t, Options{})
	sec := durationpb.New(time.Second)
	steps := []struct {
		name     string
		strategy *typev3.RateLimitStrategy
		created  int
		tokens   float64
		rate     float64
		interval time.Duration
	}{
		{"first token bucket: new, full", tokenBucketStrategy(5, 1, sec), 1, 5, 1, time.Second},
		{"the same again: kept", tokenBucketStrategy(5, 1, sec), 1, 0, 1, time.Second},
		{"fill_interval.seconds changed alone: kept, old rate", tokenBucketStrategy(5, 1, durationpb.New(2*time.Second)), 1, 0, 1, 2 * time.Second},
		{"fill_interval.nanos changed: new, full", tokenBucketStrategy(5, 1, &durationpb.Duration{Seconds: 2, Nanos: 1}), 2, 5, 0.5, 2*time.Second + 1},
		{"max_tokens changed: new, full", tokenBucketStrategy(7, 1, &durationpb.Duration{Seconds: 2, Nanos: 1}), 3, 7, 0.5, 2*time.Second + 1},
		{"tokens_per_fill changed: new, full", tokenBucketStrategy(7, 2, &durationpb.Duration{Seconds: 2, Nanos: 1}), 4, 7, 1, 2*time.Second + 1},
		{"a blanket rule", denyAll, 4, 0, 0, 0},
		{"the same token bucket after it: new, full", tokenBucketStrategy(7, 2, &durationpb.Duration{Seconds: 2, Nanos: 1}), 5, 7, 1, 2*time.Second + 1},
	}
	for _, s := range steps {
		apply(t, e, c, assign(b1, s.strategy, hour))
		a := c.Assignment(b1)
		if a.Created != s.created || a.Tokens != s.tokens || a.FillRate != s.rate || a.FillInterval != s.interval || a.From != FromServer {
			t.Fatalf("%s: assignment %+v, want created %d, tokens %v, rate %v, interval %v", s.name, a, s.created, s.tokens, s.rate, s.interval)
		}
		if a.Kind == KindTokenBucket {
			if got := drain(c, b1); got != int(s.tokens) {
				t.Fatalf("%s: %d allowed, want the %v tokens", s.name, got, s.tokens)
			}
		}
	}
	if s := c.Stats(); s.ActionsApplied != uint64(len(steps)) || s.ActionsIgnored != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestIgnoredActions: actions Envoy ignores leave the bucket's assignment and
// its timer as they were.
func TestIgnoredActions(t *testing.T) {
	perUnit := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 5, TimeUnit: typev3.RateLimitUnit_SECOND}}}
	cases := []struct {
		name   string
		action *rlqspb.RateLimitQuotaResponse_BucketAction
	}{
		{"no bucket id", &rlqspb.RateLimitQuotaResponse_BucketAction{BucketAction: assign(b1, allowAll, hour).BucketAction}},
		{"empty bucket id", assign(map[string]string{}, allowAll, hour)},
		{"unknown bucket id", assign(map[string]string{"name": "other"}, allowAll, hour)},
		{"bucket id with a key more", assign(map[string]string{"name": "b1", "tenant": "t", "x": ""}, allowAll, hour)},
		{"abandon of an unknown bucket", abandon(map[string]string{"name": "b1"})},
		{"requests_per_time_unit", assign(b1, perUnit, hour)},
		{"assignment without strategy", assign(b1, nil, hour)},
		{"assignment with an empty strategy", assign(b1, &typev3.RateLimitStrategy{}, hour)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, c := started(t, Options{})
			apply(t, e, c, assign(b1, denyAll, hour))
			held := c.Assignment(b1)
			apply(t, e, c, tc.action)
			if s := c.Stats(); s.ActionsIgnored != 1 || s.ActionsApplied != 1 {
				t.Fatalf("stats %+v, want the action ignored", s)
			}
			if a := c.Assignment(b1); a != held || c.Allow(b1) {
				t.Fatalf("assignment %+v after an ignored action, want %+v kept", a, held)
			}
		})
	}
}

// TestActionWithoutAssignmentOrAbandon: stored without a strategy (requests
// fail open) and a TTL of 0, so it expires at once to the default.
func TestActionWithoutAssignmentOrAbandon(t *testing.T) {
	e, c := started(t, Options{NoAssignment: denyAll})
	apply(t, e, c, &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: &rlqspb.BucketId{Bucket: b1}})
	wait(t, "expired to the default", func() bool { return c.Stats().Expirations == 1 })
	if a := c.Assignment(b1); a.Kind != KindDenyAll || a.From != FromDefault {
		t.Fatalf("assignment %+v, want the default DENY_ALL", a)
	}
}

// TestExpiry: an assignment's TTL (whole seconds) runs out to the
// expired_assignment_behavior fallback for its timeout, then to the default.
func TestExpiry(t *testing.T) {
	sec := durationpb.New(time.Second)
	cases := []struct {
		name     string
		opts     Options
		ttl      *durationpb.Duration
		fallback Kind // KindNone: no fallback seen
	}{
		{"no fallback: straight to the default", Options{}, sec, KindNone},
		{"TTL under 1s expires at once", Options{}, &durationpb.Duration{Nanos: 900_000_000}, KindNone},
		{"unset TTL expires at once", Options{}, nil, KindNone},
		{"fallback for its timeout (2.9s read as 2s), then the default",
			Options{Expired: denyAll, ExpiredTimeout: 2900 * time.Millisecond}, sec, KindDenyAll},
		{"fallback timeout 0 ends at once", Options{Expired: denyAll}, sec, KindNone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.NoAssignment = allowAll
			e, c := started(t, tc.opts)
			apply(t, e, c, assign(b1, tokenBucketStrategy(5, 1, sec), tc.ttl))
			if tc.fallback != KindNone {
				wait(t, "the fallback", func() bool { return c.Assignment(b1).From == FromFallback })
				if a := c.Assignment(b1); a.Kind != tc.fallback || c.Allow(b1) {
					t.Fatalf("fallback %+v, want %v", a, tc.fallback)
				}
			}
			wait(t, "the default", func() bool { return c.Assignment(b1).From == FromDefault })
			if a := c.Assignment(b1); a.Kind != KindAllowAll || !c.Allow(b1) {
				t.Fatalf("after expiry %+v, want the default ALLOW_ALL", a)
			}
			if s := c.Stats(); s.Expirations != 1 {
				t.Fatalf("stats %+v, want one expiry", s)
			}
		})
	}
}

// TestFallbackKeepsEqualTokenBucket: a fallback token bucket equal to the
// expired one carries its limiter over, drained as it was.
func TestFallbackKeepsEqualTokenBucket(t *testing.T) {
	sec := durationpb.New(time.Second)
	e, c := started(t, Options{Expired: tokenBucketStrategy(5, 1, sec), ExpiredTimeout: time.Hour})
	apply(t, e, c, assign(b1, tokenBucketStrategy(5, 1, sec), sec))
	if got := drain(c, b1); got != 5 {
		t.Fatalf("%d allowed, want 5", got)
	}
	wait(t, "the fallback", func() bool { return c.Assignment(b1).From == FromFallback })
	if a := c.Assignment(b1); a.Kind != KindTokenBucket || a.Created != 1 || a.Tokens != 0 || c.Allow(b1) {
		t.Fatalf("fallback %+v, want the drained limiter kept", a)
	}
}

// TestAssignmentRestartsTimer: resending an assignment restarts its TTL.
func TestAssignmentRestartsTimer(t *testing.T) {
	e, c := started(t, Options{})
	apply(t, e, c, assign(b1, denyAll, hour))
	first := c.Assignment(b1).Expires
	wait(t, "the clock to move", func() bool { return time.Now().After(first.Add(-time.Hour)) })
	apply(t, e, c, assign(b1, denyAll, hour))
	if again := c.Assignment(b1).Expires; !again.After(first) {
		t.Fatalf("expiry %v after the resend, want later than %v", again, first)
	}
}
