package e2e

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// gcraConfig: buckets refilling one unit per second (60 per minute), of 3
// units, of 5 (a window's worth would be 60: burst sets it), and of the
// default size, the limit.
const gcraConfig = `
domain: gcra
descriptors:
  - key: paced
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra, burst: 3}
  - key: costly # request-time weights, not costs reported after the fact
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra, burst: 5, record_costs: never}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: gcra}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: gcra}
`

// timedAnswer is an answer and the interval in which Redis decided it:
// after the request was sent, before the answer came.
type timedAnswer struct {
	resp       *rlsv3.RateLimitResponse
	sent, came time.Time
}

func (s *server) askTimed(t *testing.T, req *rlsv3.RateLimitRequest) timedAnswer {
	t.Helper()
	sent := time.Now()
	resp := s.ask(t, req)
	return timedAnswer{resp, sent, time.Now()}
}

// TestGCRABurstThenRate: a bucket of 3 refilling one unit per second admits
// its burst at once, then one unit per second; each denial's wait is when
// the next admission actually comes, to 100 ms. The checks are logical, so
// a slow machine cannot break them: an admission may not be answered before
// the earliest instant the denial announced (its request's send time plus
// the wait), and a request sent 100 ms after the latest (the denial's answer
// time plus the wait) may not be denied.
func TestGCRABurstThenRate(t *testing.T) {
	s := startServer(t, startRedis(t), gcraConfig)
	req := request("gcra", descriptor("paced", "a"))

	began := time.Now()
	admitted := 0
	a := s.askTimed(t, req)
	for ; a.resp.OverallCode == ok; a = s.askTimed(t, req) {
		admitted++
	}
	// The burst, plus at most what refilled while it was sent.
	if refill := int(time.Since(began) / time.Second); admitted < 3 || admitted > 3+refill+1 {
		t.Fatalf("%d admitted before the first denial, in %v; want the burst of 3 (plus %d refilled)", admitted, time.Since(began), refill)
	}

	const rounds = 4
	var worst time.Duration
	for round := range rounds {
		if a.resp.OverallCode != over {
			t.Fatalf("round %d: %v, want OVER_LIMIT", round, a.resp)
		}
		wait := a.resp.Statuses[0].DurationUntilReset.AsDuration()
		if wait <= 0 || wait > time.Second {
			t.Fatalf("round %d: denied with a wait of %v; one unit refills in 1s", round, wait)
		}
		if st := a.resp.Statuses[0]; st.LimitRemaining != 0 {
			t.Fatalf("round %d: denied with %d remaining", round, st.LimitRemaining)
		}
		earliest, latest := a.sent.Add(wait), a.came.Add(wait)
		// Poll every 10 ms until admitted (denied polls cost nothing).
		var lastDenied time.Time
		var p timedAnswer
		poll := time.NewTicker(10 * time.Millisecond)
		for p = s.askTimed(t, req); p.resp.OverallCode != ok; p = s.askTimed(t, req) {
			lastDenied = p.sent
			<-poll.C
		}
		poll.Stop()
		if p.came.Before(earliest) {
			t.Fatalf("round %d: admitted %v before the announced wait of %v", round, earliest.Sub(p.came), wait)
		}
		if late := lastDenied.Sub(latest); late > 100*time.Millisecond {
			t.Fatalf("round %d: still denied %v after the announced wait of %v", round, late, wait)
		}
		// The admission, as the client saw it, against the announcement.
		worst = max(worst, p.came.Sub(latest), latest.Sub(p.came))
		// It took the one unit there was, which refilled after the last
		// denied poll was sent (or the announced instant): the next unit
		// refills a second later, and a request answered before that must
		// be denied.
		refilled := earliest
		if lastDenied.After(refilled) {
			refilled = lastDenied
		}
		a = s.askTimed(t, req)
		if a.resp.OverallCode == ok && a.came.Before(refilled.Add(time.Second)) {
			t.Fatalf("round %d: a second unit %v after the first refilled", round, a.came.Sub(refilled))
		}
	}
	t.Logf("announced wait vs the admission seen, %d rounds: at most %v apart (polling every 10 ms)", rounds, worst)

	// The rate, over the whole test: the burst and one unit per second.
	total := admitted + rounds
	if limit := 3 + int(time.Since(began)/time.Second) + 1; total > limit {
		t.Fatalf("%d admitted in %v, above the burst and the rate (%d)", total, time.Since(began), limit)
	}
}

// TestGCRACostsAndAllOrNothing: a cost takes that many units and its wait
// is when that many have refilled; a cost larger than the bucket is denied
// at once; a request denied by another descriptor charges nothing; and the
// default bucket is the limit.
func TestGCRACostsAndAllOrNothing(t *testing.T) {
	t.Parallel()
	s := startLibrary(t, startRedis(t), gcraConfig, nil)
	withCost := func(value string, cost uint64) *rlsv3.RateLimitRequest {
		d := descriptor("costly", value)
		d.HitsAddend = wrapperspb.UInt64(cost)
		return request("gcra", d)
	}

	st := s.ask(t, withCost("a", 4)).Statuses[0]
	if st.Code != ok || st.LimitRemaining != 1 {
		t.Fatalf("cost 4 of a bucket of 5: %v, want OK with 1 remaining", st)
	}
	if full := st.DurationUntilReset.AsDuration(); full <= 3*time.Second || full > 4*time.Second {
		t.Fatalf("cost 4 at one unit per second: full again in %v, want (3s, 4s]", full)
	}
	// Three more need two more units: 2 s, less what refilled since.
	st = s.ask(t, withCost("a", 3)).Statuses[0]
	if wait := st.DurationUntilReset.AsDuration(); st.Code != over || wait <= 0 || wait > 2*time.Second {
		t.Fatalf("cost 3 with 1 left: %v, want OVER_LIMIT with a wait in (0, 2s]", st)
	}
	// A check without cost sees what is left, and takes nothing.
	for range 3 {
		if st := s.ask(t, withCost("a", 0)).Statuses[0]; st.Code != ok || st.LimitRemaining < 1 {
			t.Fatalf("a check: %v, want OK with at least 1 remaining", st)
		}
	}
	// Larger than the bucket: never admitted.
	if st := s.ask(t, withCost("b", 6)).Statuses[0]; st.Code != over {
		t.Fatalf("cost 6 in a bucket of 5: %v", st)
	}

	// All or nothing: other=x admits one per hour; with it spent, a request
	// holding it and a costly descriptor charges the costly one nothing.
	if resp := s.ask(t, request("gcra", descriptor("other", "x"))); resp.OverallCode != ok {
		t.Fatalf("other=x, first hit: %v", resp)
	}
	d := descriptor("costly", "c")
	d.HitsAddend = wrapperspb.UInt64(5)
	resp := s.ask(t, request("gcra", d, descriptor("other", "x")))
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("a request denied by other=x: %v, want the costly descriptor OK and uncharged (5 remaining)", resp)
	}
	if st := s.ask(t, withCost("c", 5)).Statuses[0]; st.Code != ok || st.LimitRemaining != 0 {
		t.Fatalf("the whole bucket after the denied request: %v, want OK", st)
	}

	// The default bucket is requests_per_unit: 4 at once, then denied for
	// one unit's time, a quarter of a minute.
	for i := range 4 {
		if resp := s.ask(t, request("gcra", descriptor("plain", "p"))); resp.OverallCode != ok {
			t.Fatalf("plain, hit %d: %v", i+1, resp)
		}
	}
	st = s.ask(t, request("gcra", descriptor("plain", "p"))).Statuses[0]
	if wait := st.DurationUntilReset.AsDuration(); st.Code != over || wait <= 10*time.Second || wait > 15*time.Second {
		t.Fatalf("plain, hit 5: %v, want OVER_LIMIT for up to 15s", st)
	}
}

// gcraLimits are the day limits of the cluster tests' gcra rules: one unit
// refills every day / limit (14 minutes or more), so within a test a charge
// of k units still lacks k.
var gcraLimits = map[string]int64{"hot_gcra": 100, "aon_gcra": 3, "ms_gcra": 40, "mig_gcra": 13, "mig_load_gcra": 10}

// gcraOwed is the whole units the GCRA bucket at key lacks, by the key schema
// (docs/stores.md): its value is the TAT, "<Unix microseconds>:<remainder>".
func gcraOwed(t *testing.T, c *redis.Client, key string, limit int64) int64 {
	t.Helper()
	ctx := context.Background()
	v, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	us, _, _ := strings.Cut(v, ":")
	tat, err := strconv.ParseInt(us, 10, 64)
	if err != nil {
		t.Fatalf("%s holds %q, want a TAT", key, v)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	owed := tat - now.UnixMicro()
	if owed <= 0 {
		return 0
	}
	interval := int64(24*time.Hour/time.Microsecond) / limit // whole microseconds: each rule's divides
	return (owed + interval - 1) / interval
}
