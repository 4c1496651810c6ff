package service

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

const rlqsRules = `
domain: edge
descriptors:
  - key: name
    value: quota
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 600}
  - key: name
    value: shadow
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: name
    value: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: name
    value: open
    rate_limit: {unlimited: true}
`

// rlqsTest is the quota service on a bufconn, beside the rate limit
// service of the same config and store.
type rlqsTest struct {
	svc     *Service
	rlqs    *RLQS
	m       *miniredis.Miniredis
	now     time.Time // Redis's and the allocator's clock
	metrics *prometheus.Registry
	stream  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	syncs   int // the buckets sync reported
}

func newRLQSTest(t *testing.T) *rlqsTest {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(rlqsRules), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	r := &rlqsTest{m: m, now: time.Unix(1_700_006_400, 0)}
	m.SetTime(r.now)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	reg := prometheus.NewRegistry()
	svc := New(cfg, decision.Direct(l), &Options{Metrics: metrics.New(reg)})
	q := NewRLQS(svc, rlqs.New(l, &rlqs.Options{Now: func() time.Time { return r.now }}))

	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, q)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.svc, r.rlqs, r.metrics, r.stream = svc, q, reg, stream
	return r
}

// advance moves the clock (the test's goroutine alone reads it while no
// report is in flight).
func (r *rlqsTest) advance(d time.Duration) {
	r.now = r.now.Add(d)
	r.m.SetTime(r.now)
}

func usage(allowed uint64, kv ...string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	id := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		id[kv[i]] = kv[i+1]
	}
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqsv3.BucketId{Bucket: id}, NumRequestsAllowed: allowed, TimeElapsed: durationpb.New(0),
	}
}

// report sends one report and returns the answer's actions by bucket key.
func (r *rlqsTest) report(t *testing.T, domain string, usages ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage,
) map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	if err := r.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: usages}); err != nil {
		t.Fatal(err)
	}
	resp, err := r.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction{}
	for _, a := range resp.BucketAction {
		actions[bucketKey(a.BucketId.Bucket)] = a
	}
	return actions
}

// sync returns once the service has done what follows its last answer
// (Confirm: a replaced bucket's give-back, a smaller share): it reports a
// bucket new to the stream, which no rule matches (counted unmatched), and
// waits for its answer, which the stream sends only after that.
func (r *rlqsTest) sync(t *testing.T, domain string) {
	t.Helper()
	r.syncs++
	if err := r.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain,
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(0, "sync", fmt.Sprint(r.syncs))}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.stream.Recv(); err != nil {
		t.Fatal(err)
	}
}

func strategyOf(a *rlqsv3.RateLimitQuotaResponse_BucketAction) *typev3.RateLimitStrategy {
	return a.GetQuotaAssignmentAction().GetRateLimitStrategy()
}

// TestRLQSAssignments: each bucket id gets the assignment of the rule its
// entries reach, in whatever order its map holds them.
func TestRLQSAssignments(t *testing.T) {
	r := newRLQSTest(t)
	actions := r.report(t, "edge",
		usage(1, "user", "alice", "name", "quota"),
		usage(1, "name", "shadow", "user", "bob"),
		usage(1, "name", "closed"),
		usage(1, "name", "open"),
		usage(1, "name", "nowhere"),
		usage(1, "name", "quota", "user", "carol", "extra", "x"),
	)
	tb := strategyOf(actions[bucketKey(map[string]string{"name": "quota", "user": "alice"})]).GetTokenBucket()
	if tb == nil || tb.FillInterval.AsDuration() != time.Minute || tb.TokensPerFill.GetValue() == 0 || tb.MaxTokens == 0 {
		t.Errorf("name=quota,user=alice: %v, want a token bucket refilled per minute", tb)
	}
	for _, tc := range []struct {
		id   map[string]string
		want typev3.RateLimitStrategy_BlanketRule
	}{
		{map[string]string{"name": "shadow", "user": "bob"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"name": "closed"}, typev3.RateLimitStrategy_DENY_ALL},
		{map[string]string{"name": "open"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"name": "nowhere"}, typev3.RateLimitStrategy_ALLOW_ALL},
		{map[string]string{"name": "quota", "user": "carol", "extra": "x"}, typev3.RateLimitStrategy_ALLOW_ALL},
	} {
		a := actions[bucketKey(tc.id)]
		if got := strategyOf(a); got == nil || got.GetBlanketRule() != tc.want || got.GetTokenBucket() != nil {
			t.Errorf("%v: %v, want %v", tc.id, got, tc.want)
		}
		if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); ttl != rlqs.DefaultLease {
			t.Errorf("%v: time to live %v, want %v", tc.id, ttl, rlqs.DefaultLease)
		}
	}
	if got := counterValue(t, r.metrics, "ratelimit_rlqs_unmatched_total"); got != 2 {
		t.Errorf("ratelimit_rlqs_unmatched_total = %v, want 2 (an unknown value, an extra key)", got)
	}
}

// TestRLQSSharesTheCounter: the quota service's lease is on the counter
// ShouldRateLimit decides the same descriptor on, and a counter taken by
// ShouldRateLimit turns the assignment to DENY_ALL.
func TestRLQSSharesTheCounter(t *testing.T) {
	r := newRLQSTest(t)
	r.report(t, "edge", usage(1, "user", "alice", "name", "quota"))
	r.sync(t, "edge")
	d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{
		{Key: "name", Value: "quota"}, {Key: "user", Value: "alice"},
	}}
	resp, err := r.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	if left := resp.Statuses[0].LimitRemaining; left >= 599 {
		t.Fatalf("ShouldRateLimit sees %d of 600 left after a lease: the lease is elsewhere", left)
	}
	// ShouldRateLimit's callers take what the counter has left, as it
	// frees up (a bucket turned to DENY_ALL gives back what it leased
	// ahead). The lease in force stays; within two reports the bucket is
	// denied.
	var got *typev3.RateLimitStrategy
	for range 2 {
		check, err := r.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d},
		})
		if err != nil {
			t.Fatal(err)
		}
		if left := check.Statuses[0].LimitRemaining; left > 0 {
			resp, err := r.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
				Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}, HitsAddend: left,
			})
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("taking the %d left: %v %v", left, resp, err)
			}
		}
		r.advance(5 * time.Second)
		actions := r.report(t, "edge", usage(50, "user", "alice", "name", "quota"))
		r.sync(t, "edge") // a replaced bucket gives back after its answer: the callers take that too
		got = strategyOf(actions[bucketKey(map[string]string{"name": "quota", "user": "alice"})])
	}
	if got.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || got.GetTokenBucket() != nil {
		t.Errorf("two reports after ShouldRateLimit took the counter: %v, want DENY_ALL", got)
	}
}

// TestRLQSStoreDown: no action for a bucket the store cannot lease, so
// that Envoy's own expired_assignment_behavior applies in time.
func TestRLQSStoreDown(t *testing.T) {
	r := newRLQSTest(t)
	r.m.Close()
	if err := r.stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(1, "name", "quota", "user", "alice"), usage(1, "name", "open"),
	}}); err != nil {
		t.Fatal(err)
	}
	resp, err := r.stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BucketAction) != 1 || resp.BucketAction[0].BucketId.Bucket["name"] != "open" {
		t.Errorf("with the store down: %v, want the unlimited bucket's action alone", resp.BucketAction)
	}
}

// TestRLQSDrain: a drain ends the stream, so that Envoy reconnects
// elsewhere.
func TestRLQSDrain(t *testing.T) {
	r := newRLQSTest(t)
	r.report(t, "edge", usage(1, "name", "open"))
	r.rlqs.Drain()
	if _, err := r.stream.Recv(); err == nil {
		t.Error("the stream is still open after a drain")
	}
}

// counterValue is the value of a counter without labels.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.Metric[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestRLQSBucketsBound: past the buckets all streams may hold, a new bucket
// gets no action (Envoy's no_assignment_behavior applies) while the known
// ones keep theirs; a stream's end gives its buckets back.
func TestRLQSBucketsBound(t *testing.T) {
	r := newRLQSTest(t)
	r.rlqs.maxTotal = 2
	actions := r.report(t, "edge", usage(1, "name", "open"), usage(1, "name", "closed"), usage(1, "name", "nowhere"))
	if len(actions) != 2 || actions[bucketKey(map[string]string{"name": "nowhere"})] != nil {
		t.Fatalf("3 buckets with room for 2: %d actions (%v), want the first two", len(actions), actions)
	}
	r.advance(rlqs.MinReportGap)
	if actions = r.report(t, "edge", usage(1, "name", "open"), usage(1, "name", "nowhere")); len(actions) != 1 {
		t.Fatalf("a known bucket and a new one past the bound: %d actions, want the known one's", len(actions))
	}
	if err := r.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitfor.True(5*time.Second, 10*time.Millisecond, func() bool { return r.rlqs.buckets.Load() == 0 })
	if n := r.rlqs.buckets.Load(); n != 0 {
		t.Fatalf("%d buckets held after the stream ended, want 0", n)
	}
}

// TestRLQSFrequentReportsCostNoMore: a client reporting every 10 ms costs
// the store no more commands than one reporting every second: its bucket
// is decided once a second (rlqs.MinReportGap), its counts added up.
func TestRLQSFrequentReportsCostNoMore(t *testing.T) {
	commands := map[time.Duration]int{}
	decisions := map[time.Duration]int{}
	for _, every := range []time.Duration{10 * time.Millisecond, time.Second} {
		r := newRLQSTest(t)
		buckets := map[string]*rlqsBucket{}
		start := r.m.CommandCount()
		for elapsed := time.Duration(0); elapsed < 3*time.Second; elapsed += every {
			resp, _ := r.rlqs.answer(context.Background(), "member", "edge", buckets, &rlqsv3.RateLimitQuotaUsageReports{
				Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
					usage(uint64(every/time.Millisecond), "user", "alice", "name", "quota")}})
			decisions[every] += len(resp.BucketAction)
			r.advance(every)
		}
		commands[every] = r.m.CommandCount() - start
	}
	t.Logf("over 3 s: every 10ms %d Redis commands, %d decisions; every 1s %d commands, %d decisions",
		commands[10*time.Millisecond], decisions[10*time.Millisecond], commands[time.Second], decisions[time.Second])
	if commands[10*time.Millisecond] > commands[time.Second] {
		t.Errorf("reports every 10ms cost %d Redis commands, more than the %d of reports every second",
			commands[10*time.Millisecond], commands[time.Second])
	}
	if decisions[10*time.Millisecond] != 3 {
		t.Errorf("reports every 10ms for 3 s decided %d times, want 3 (once a second)", decisions[10*time.Millisecond])
	}
}
