package service_test

import (
	"context"
	"fmt"
	"net"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
	"github.com/slidingwindow/ratelimit/pkg/service"
)

// Serve ShouldRateLimit on one's own gRPC server, then call it as Envoy does.
func Example() {
	cfg, err := config.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 1}
`), nil)
	if err != nil {
		panic(err)
	}
	lim, err := limiter.NewEmbedded(nil) // limiter.New(redisClient, nil) in production
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	svc := service.New(cfg, lim, nil)

	srv := grpc.NewServer(svc.ServerOptions()...)
	svc.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer func() { _ = conn.Close() }()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user_id", Value: "42"}},
	}}}
	for range 2 {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Println(resp.OverallCode)
	}
	// Output:
	// OK
	// OVER_LIMIT
}
