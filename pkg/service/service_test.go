package service_test

import (
	"context"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
	"github.com/slidingwindow/ratelimit/pkg/ratelimittest"
	"github.com/slidingwindow/ratelimit/pkg/service"
)

const perMinute = `
domain: api
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
`

func request(user string, hits uint32) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: hits, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user_id", Value: user}},
	}}}
}

// A Go program's hits on limiter.Key's key count on the counter the service
// keeps for Envoy's descriptor, with the prefix both are given.
func TestLimiterSharesTheServiceCounter(t *testing.T) {
	srv := ratelimittest.Start(t, perMinute, &service.Options{KeyPrefix: "svc-"})
	limit := limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 3, Window: time.Minute}
	key, err := limiter.Key("svc-", "api", limit, config.Entry{Key: "user_id", Value: "42"})
	if err != nil {
		t.Fatal(err)
	}
	v, err := srv.Limiter.Decide(context.Background(), limiter.Hit{Key: key, Limit: limit, Cost: 2})
	if err != nil || !v[0].Admitted || v[0].Remaining != 1 {
		t.Fatalf("limiter: %+v, %v; want admitted with 1 remaining", v, err)
	}
	client := srv.Client(t)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), request("42", 1))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != want {
			t.Errorf("call %d: %v, want %v", i, resp.OverallCode, want)
		}
	}
}

func TestOptionsAndReload(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  *service.Options
		codes []rlsv3.RateLimitResponse_Code // for 4 calls of one hit each
	}{
		{"defaults", nil, []rlsv3.RateLimitResponse_Code{1, 1, 1, 2}},
		{"shadow mode", &service.Options{ShadowMode: true}, []rlsv3.RateLimitResponse_Code{1, 1, 1, 1}},
	} {
		srv := ratelimittest.Start(t, perMinute, tc.opts)
		for i, want := range tc.codes {
			resp, err := srv.Service.ShouldRateLimit(context.Background(), request(tc.name, 1))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode != want {
				t.Errorf("%s: call %d: %v, want %v", tc.name, i, resp.OverallCode, want)
			}
		}
	}

	srv := ratelimittest.Start(t, perMinute, &service.Options{RateLimitHeaders: true})
	resp, err := srv.Service.ShouldRateLimit(context.Background(), request("r", 1))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) == 0 {
		t.Fatalf("before reload: %v, %v; want OK with headers", resp, err)
	}
	cfg, err := config.Parse("zero.yaml", []byte("domain: api\ndescriptors:\n  - key: user_id\n    rate_limit: {unit: minute, requests_per_unit: 0}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !srv.Service.Reload(cfg) {
		t.Fatal("Reload kept the config in force")
	}
	if srv.Service.Reload(cfg) {
		t.Error("Reload of the config in force: reported as put in force")
	}
	if resp, err := srv.Service.ShouldRateLimit(context.Background(), request("r", 1)); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after reload to a limit of 0: %v, %v; want OVER_LIMIT", resp, err)
	}
}

// Register serves the quota service too: a report is answered with an
// assignment, and Drain ends the stream.
func TestQuotaServiceRegistered(t *testing.T) {
	srv := ratelimittest.Start(t, perMinute, nil)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bucket := &rlqsv3.BucketId{Bucket: map[string]string{"user_id": "q"}}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: bucket, NumRequestsAllowed: 1,
	}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BucketAction) != 1 || resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Errorf("answer %v: want one token bucket assignment", resp)
	}
	srv.Service.Drain()
	if _, err := stream.Recv(); err == nil {
		t.Error("after Drain: the stream goes on")
	}
}
